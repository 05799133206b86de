"""LoRA on transformer-engine's layers is accepted (megarl/models/lora.py adapts TE's linears too); grouped
experts asked for explicitly with LoRA are refused before Ray starts, naming the key
(megarl/config/rules/engines.py), since a LoRA build makes every expert an MLP of its own. Packages simulated
as the other config-rule tests do (`installed`)."""

from __future__ import annotations

import pytest

from megarl.config import collect_issues

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
RANK = "actor_rollout_ref.model.lora.rank"


@pytest.mark.parametrize("rank, overrides, refused", [
    (8, {}, False),  # TE's layers run and LoRA adapts them
    (8, {"transformer_impl": "local"}, False),
    (8, {"moe_grouped_gemm": True}, True),
    (0, {"moe_grouped_gemm": True}, False),  # full-parameter training keeps grouped experts
])
def test_lora_refuses_only_grouped_experts_asked_for(make, rank, overrides, refused):
    cfg = make({"trainer.device": "cuda", RANK: rank, OTC: overrides})
    issues = [i for i in collect_issues(cfg, installed=lambda name: name == "transformer_engine")
              if "LoRA" in i.problem]
    assert [i.key for i in issues] == ([f"{OTC}.moe_grouped_gemm"] if refused else []), [i.format() for i in issues]
    if refused:
        assert f"remove {OTC}.moe_grouped_gemm" in issues[0].fix
