"""The router load-balancing loss follows the HF config (``output_router_logits``,
``router_aux_loss_coef``): its gradients equal HF transformers' ``router_aux_loss_coef * aux_loss``
for a model with one MoE layer (where HF's pooling of all layers' router statistics and
megatron's per-layer term are the same loss), and it is off when ``output_router_logits`` is."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.dist_utils import run_distributed
from hf_tiny import checkpoint_named_grads, make_tiny_hf
from mcore_body import aux_loss_grads


def _hf_aux_loss_grads(hf_dir: str, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF gradients of ``router_aux_loss_coef * aux_loss`` (0 where it does not reach)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    out = model(input_ids=input_ids, output_router_logits=True)
    (model.config.router_aux_loss_coef * out.aux_loss).backward()
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    return checkpoint_named_grads(model)


@pytest.mark.slow
def test_load_balancing_loss_gradients_equal_hf(tmp_path):
    hf_dir = make_tiny_hf("qwen3_moe_dense0", str(tmp_path / "on"), num_layers=2)  # layer 1: the MoE layer
    input_ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3))
    off_dir = tmp_path / "off"  # same weights, output_router_logits=false
    off_dir.mkdir()
    (off_dir / "model.safetensors").write_bytes((tmp_path / "on" / "model.safetensors").read_bytes())
    config = json.loads((tmp_path / "on" / "config.json").read_text())
    (off_dir / "config.json").write_text(json.dumps({**config, "output_router_logits": False}))

    on, off = run_distributed(aux_loss_grads, 1, {}, [hf_dir, str(off_dir)], input_ids, timeout=240)[0]

    expected = _hf_aux_loss_grads(hf_dir, input_ids)
    assert on["load_balancing_type"] == "aux_loss" and off["load_balancing_type"] == "none"
    router = "model.layers.1.mlp.gate.weight"
    assert expected[router].abs().max() > 1e-4  # the reference has a gradient to compare
    assert set(on["grads"]) == set(expected)
    for name, grad in on["grads"].items():
        torch.testing.assert_close(grad, expected[name], atol=1e-7, rtol=1e-4, msg=name)
    assert all(not g.any() for g in off["grads"].values())

