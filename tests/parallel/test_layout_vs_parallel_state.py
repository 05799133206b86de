"""ParallelLayout's rank coordinates equal megatron-core's parallel_state on every rank.

8 CPU processes (gloo) build megatron's groups through ``megarl.parallel.init_distributed``
for several layouts in turn; every rank reports its ranks and group sizes from
parallel_state, which must equal what the layout computes for that rank.
"""

from __future__ import annotations

import pytest
from helpers.dist_utils import run_distributed

from megarl.parallel.layout import ParallelLayout

pytestmark = pytest.mark.slow

WORLD = 8
# megatron config (verl key names) per case; together they cover tp, pp, vpp, cp, ep, etp.
CASES = [
    {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
    {"tensor_model_parallel_size": 2, "context_parallel_size": 2},
    {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},
    {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 1},
    {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 1},
    {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "context_parallel_size": 2,
     "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1},
]


def _parallel_state_view(cases: list[dict]) -> list[dict]:
    """Per case: this rank's indices and group sizes as megatron's parallel_state reports them."""
    from megatron.core import parallel_state as ps

    from megarl.parallel import init_distributed

    seen = []
    for cfg in cases:
        layout = init_distributed(cfg, "cpu", seed=42)
        seen.append({
            "layout": layout,
            "dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(), "cp": ps.get_context_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(), "etp": ps.get_expert_tensor_parallel_rank(),
            "expert_dp": ps.get_expert_data_parallel_rank(),
            "dp_size": ps.get_data_parallel_world_size(),
            "expert_dp_size": ps.get_expert_data_parallel_world_size(),
        })
        ps.destroy_model_parallel()
    return seen


def test_layout_coordinates_equal_parallel_state():
    per_rank = run_distributed(_parallel_state_view, WORLD, CASES, timeout=900)
    for i, cfg in enumerate(CASES):
        expected = ParallelLayout.from_megatron_config(cfg, WORLD)
        for rank, seen in enumerate(per_rank):
            got = seen[i]
            assert got["layout"] == expected, cfg  # what init_distributed built the groups from
            c = expected.coordinates(rank)
            assert (got["dp"], got["tp"], got["pp"], got["cp"]) == (c.dp, c.tp, c.pp, c.cp), (cfg, rank)
            assert (got["ep"], got["etp"], got["expert_dp"]) == (c.ep, c.etp, c.expert_dp), (cfg, rank)
            assert (got["dp_size"], got["expert_dp_size"]) == (expected.dp, expected.expert_dp), cfg
