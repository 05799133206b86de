"""Critic value head, HF checkpoint export and config overrides, at PP=2 (2 ranks)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.dist_utils import run_distributed
from hf_tiny import make_tiny_hf, padded_batch
from mcore_body import critic_save_and_config
from safetensors.torch import load_file


@pytest.mark.slow
def test_value_head_save_and_override(tmp_path):
    critic_dir = make_tiny_hf("qwen2_tied", str(tmp_path / "critic"))  # tied: critic must untie
    actor_dir = make_tiny_hf("qwen3_moe", str(tmp_path / "actor"), num_layers=2)
    (tmp_path / "actor" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    batch = padded_batch(96)
    out_dir = tmp_path / "saved"
    per_rank = run_distributed(
        critic_save_and_config, 2, {"pipeline_model_parallel_size": 2},
        str(critic_dir), str(actor_dir), str(out_dir), batch, timeout=240,
    )

    # Values [b, s] on the last stage = HF final hidden state (after norm) . score weight.
    input_ids, attention_mask, position_ids = batch
    last = per_rank[1]
    assert per_rank[0]["values"] is None
    score = last["export"]["score.weight"]
    assert score.shape == (1, 64)
    assert "lm_head.weight" not in last["export"]
    hf_model = transformers.AutoModel.from_pretrained(critic_dir, dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = hf_model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids).last_hidden_state
    expected = (hidden @ score.T)[..., 0]
    assert last["values"].shape == input_ids.shape
    valid = attention_mask.bool()
    torch.testing.assert_close(last["values"][valid], expected[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(per_rank[0]["export"]["score.weight"], score, atol=0, rtol=0)

    # save_hf_checkpoint: bitwise the original weights, loadable config, tokenizer copied.
    original, saved = load_file(f"{actor_dir}/model.safetensors"), load_file(out_dir / "model.safetensors")
    assert set(saved) == set(original)
    assert all(torch.equal(saved[k], original[k]) for k in original)
    assert transformers.AutoConfig.from_pretrained(out_dir).num_experts_per_tok == 2
    assert (out_dir / "tokenizer_config.json").exists()

    assert last["hidden_dropout"] == 0.25
    assert "no_such_field" in last["unknown_error"]
