"""verl's `attention_backend=flash` where transformer-engine's layers run without the flash-attn
package (megarl's GPU stack) runs TE's fused (cuDNN) attention, with one line saying so; with
flash-attn it stays flash; without TE the existing rules apply (the local spec; no notice). The
packages are simulated as the config rules' tests do (`installed`); the model config's as
monkeypatched imports (this machine has neither)."""

from __future__ import annotations

import pytest
import torch
import transformers
from megatron.core.transformer.enums import AttnBackend

import megarl.models.config as model_config
from megarl.config import collect_issues
from megarl.config.rules.engines import attention_notice
from megarl.parallel.layout import ParallelLayout

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
TE = "transformer_engine"


def _stack(*modules):
    return lambda name: name in modules


@pytest.mark.parametrize("installed, noted", [
    (_stack(TE), True),  # megarl's GPU stack
    (_stack(TE, "flash_attn"), False),  # flash-attn: TE's flash attention runs as asked
    (_stack(), False),  # no TE: the local spec runs; the backend picks no TE kernel
])
def test_notice_only_where_tes_fused_attention_replaces_flash(make, installed, noted):
    cfg = make({"trainer.device": "cuda", OTC: {"attention_backend": "flash"}})
    assert not [i for i in collect_issues(cfg, installed=installed) if "attention_backend" in i.key]
    notice = attention_notice(cfg, installed)
    assert (notice is not None) == noted
    if noted:
        assert "\n" not in notice and notice.startswith(f"{OTC}.attention_backend") and "fused (cuDNN)" in notice


def test_other_backends_get_no_notice(make):
    assert attention_notice(make({"trainer.device": "cuda", OTC: {"attention_backend": "fused"}}), _stack(TE)) is None


@pytest.mark.parametrize("flash_attn, impl, want", [
    (False, TE, AttnBackend.fused),
    (True, TE, AttnBackend.flash),
    (False, "local", AttnBackend.flash),  # megatron's local spec: the backend selects no TE kernel
])
def test_the_model_config_gets_the_backend_that_runs(monkeypatch, flash_attn, impl, want):
    monkeypatch.setattr(model_config, "resolve_transformer_impl", lambda *a: (impl, ""))
    monkeypatch.setattr(model_config, "has_module", lambda name: flash_attn and name == "flash_attn")
    monkeypatch.setattr(model_config.ParallelLayout, "from_parallel_state", staticmethod(lambda: ParallelLayout(world_size=1)))
    hf = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=97)
    # TE's fused RoPE / wgrad need the package at config time; this machine has none
    overrides = {"attention_backend": "flash", "apply_rope_fusion": False, "gradient_accumulation_fusion": False}
    got = model_config.hf_to_transformer_config(hf, {"override_transformer_config": overrides}, device="cpu",
                                                dtype=torch.float32)
    assert got.attention_backend == want
