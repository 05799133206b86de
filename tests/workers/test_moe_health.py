"""The step's MoE health metrics (expert load, load-balancing loss, router entropy) from the actor's
old-log-prob pass, against the same quantities computed from HF transformers' own router logits on the same
tokens; one rank, and expert-parallel over 2 ranks (each counts its rows, the sums are global)."""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny_hf import build_tiny_qwen3_moe
from replay_bodies import hf_moe_health, moe_health_pass

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hf_dir = build_tiny_qwen3_moe(tmp_path_factory.mktemp("health_qwen3_moe"), num_layers=3, num_experts=8,
                                  mlp_only_layers=(0,))
    gen = torch.Generator().manual_seed(3)
    # each micro-batch of 3 rows as long on both EP ranks: megatron's allgather dispatcher (CPU) gathers equal shapes
    lengths = torch.tensor([5, 9, 3, 12, 7, 9, 4, 12])
    mask = (torch.arange(12)[None] < lengths[:, None]).long().flip(-1)  # left-padded rows
    batch = {"input_ids": torch.randint(1, 90, mask.shape, generator=gen) * mask, "attention_mask": mask,
             "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": torch.zeros(8, 4, dtype=torch.long),
             "response_mask": mask[:, -4:]}
    return str(hf_dir), batch, hf_moe_health(str(hf_dir), batch)


@pytest.mark.parametrize("world, megatron", [(1, {}), (2, {"expert_model_parallel_size": 2})], ids=["one_rank", "ep2"])
def test_moe_health_metrics_match_hf_routers(setup, world, megatron):
    hf_dir, batch, expected = setup
    assert 1.2 < expected["moe/expert_load_max_over_mean/max"]  # an unbalanced random router: a real comparison
    for got in run_distributed(moe_health_pass, world, hf_dir, megatron, batch, timeout=600):
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-4), key
