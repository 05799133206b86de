"""LoRA where transformer-engine's layers would run is refused before Ray starts, naming the key and
`transformer_impl=local` (megarl/config/rules/engines.py); the model build refuses the same inside a
worker (megarl/models/lora.py). Packages simulated as the other config-rule tests do (`installed`)."""

from __future__ import annotations

import pytest

from megarl.config import collect_issues

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
RANK = "actor_rollout_ref.model.lora.rank"


@pytest.mark.parametrize("device, te_installed, overrides, refused", [
    ("cuda", True, {}, True),  # a GPU node with TE: TE's layers run
    ("cuda", True, {"transformer_impl": "local"}, False),  # megatron's own linears, which LoRA adapts
    ("cuda", False, {}, False),  # no TE: the local spec runs anyway
    ("cpu", True, {}, False),
])
def test_lora_is_refused_up_front_only_where_te_layers_run(make, device, te_installed, overrides, refused):
    cfg = make({"trainer.device": device, RANK: 8, OTC: overrides})
    issues = [i for i in collect_issues(cfg, installed=lambda name: te_installed and name == "transformer_engine")
              if i.key == RANK and "transformer-engine" in i.problem]
    assert bool(issues) == refused, [i.format() for i in issues]
    if refused:
        assert f"+{OTC}.transformer_impl=local" in issues[0].fix
