"""ParallelLayout: sizes, rules and rank coordinates against hand-derived values (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from megarl.parallel.layout import MEGATRON_ORDER, ParallelLayout, RankCoordinates


def test_derived_sizes():
    # 16 ranks, tp 2, pp 4: 8 ranks hold one model copy, 2 copies; experts follow tp (etp=2).
    layout = ParallelLayout(world_size=16, tp=2, pp=4)
    assert (layout.model_parallel_size, layout.dp, layout.etp, layout.expert_dp) == (8, 2, 2, 2)
    # 16 ranks, tp 2 x pp 2 x cp 2 -> dp 2; experts: etp 1 x ep 2 x pp 2 = 4 -> expert dp 4.
    moe = ParallelLayout(world_size=16, tp=2, pp=2, cp=2, ep=2, etp=1)
    assert (moe.model_parallel_size, moe.dp, moe.expert_dp) == (8, 2, 4)


def test_megatron_docstring_example_groups():
    """initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4 give these groups."""
    layout = ParallelLayout(world_size=16, tp=2, pp=4)
    groups = {
        "dp": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "pp": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
    }
    coords = [layout.coordinates(rank) for rank in range(16)]
    for axis, members in groups.items():
        others = [a for a in ("dp", "tp", "pp") if a != axis]
        for group in members:
            # Along a group the axis' index counts up; the other indices stay fixed.
            assert [getattr(coords[r], axis) for r in group] == list(range(len(group)))
            assert len({tuple(getattr(coords[r], a) for a in others) for r in group}) == 1


def test_coordinates_hand_derived_with_cp_and_experts():
    # world 8: tp 2 (fastest), cp 2, dp 1, pp 2. Experts: etp 1, ep 4, expert dp 1, pp 2.
    layout = ParallelLayout(world_size=8, tp=2, pp=2, cp=2, ep=4, etp=1)
    assert layout.coordinates(5) == RankCoordinates(dp=0, tp=1, pp=1, cp=0, ep=1, etp=0, expert_dp=0)
    assert layout.coordinates(3) == RankCoordinates(dp=0, tp=1, pp=0, cp=1, ep=3, etp=0, expert_dp=0)
    # world 8: tp 1, dp 4, pp 2; experts: etp 1, ep 2, expert dp 2.
    moe = ParallelLayout(world_size=8, pp=2, ep=2, etp=1)
    assert [moe.coordinates(r).dp for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [moe.coordinates(r).ep for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [moe.coordinates(r).expert_dp for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [moe.coordinates(r).pp for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_rank_inverts_coordinates_and_output_ranks():
    layout = ParallelLayout(world_size=24, tp=2, pp=3, cp=2)
    for rank in range(24):
        c = layout.coordinates(rank)
        assert layout.rank(dp=c.dp, tp=c.tp, pp=c.pp, cp=c.cp) == rank
    # tp 2, pp 2, dp 2: ranks 0,1 (dp0 stage 0), 2,3 (dp1 stage 0), 4,5 (dp0 stage 1), 6,7 (dp1 stage 1).
    assert ParallelLayout(world_size=8, tp=2, pp=2).output_ranks() == [4, 6]
    assert ParallelLayout(world_size=2, cp=2).output_ranks() == [0]
    with pytest.raises(ValueError, match="pp rank 2 is outside 0..1"):
        ParallelLayout(world_size=8, tp=2, pp=2).rank(pp=2)


def test_rollout_replicas_are_the_dp_groups_of_a_tp_layout():
    replicas = ParallelLayout(world_size=6, tp=2)  # vLLM TP 2 on 6 ranks: replicas 0,0,1,1,2,2
    assert replicas.dp == 3
    assert [replicas.coordinates(r).dp for r in range(6)] == [r // 2 for r in range(6)]
    assert replicas.output_ranks() == [0, 2, 4]


def test_problems_name_the_size_to_change():
    assert ParallelLayout(world_size=8, tp=2, pp=2, ep=2).problems() == []
    (tp,) = ParallelLayout(world_size=2, pp=4).problems()
    assert tp.size == "tp" and tp.message == "tp=1 x pp=4 x cp=1 = 4 does not divide the world size = 2"
    (ep,) = ParallelLayout(world_size=4, pp=2, ep=4, etp=1).problems()
    assert ep.size == "ep" and "ep=4 x expert tp=1 = 4 does not divide world / pp = 2" in ep.message
    # megatron refuses any vpp (even 1) without pipeline parallelism.
    for vpp in (1, 2):
        (problem,) = ParallelLayout(world_size=1, vpp=vpp).problems()
        assert problem.size == "vpp" and "pipeline_model_parallel_size > 1" in problem.message
    # Independent rules at once; the expert rule waits for the dense one (etp = tp 3 fails both).
    assert [p.size for p in ParallelLayout(world_size=4, tp=3, vpp=2).problems()] == ["tp", "vpp"]
    assert [p.size for p in ParallelLayout(world_size=4, tp=2, ep=4, vpp=2).problems()] == ["ep", "vpp"]
    assert "does not divide ranks = 2" in ParallelLayout(world_size=2, tp=4).problems(world_name="ranks")[0].message


def test_validate_and_coordinates_refuse_a_layout_that_does_not_fit():
    ParallelLayout(world_size=4, tp=2).validate()
    bad = ParallelLayout(world_size=6, tp=4, vpp=2)
    with pytest.raises(ValueError, match="megatron.tensor_model_parallel_size.*megatron.virtual_pipeline"):
        bad.validate()
    with pytest.raises(ValueError, match="does not divide"):
        bad.coordinates(0)
    with pytest.raises(ValueError, match="rank 4 is outside the world of 4 ranks"):
        ParallelLayout(world_size=4).coordinates(4)


@pytest.mark.parametrize("field, value", [("tp", 0), ("pp", -1), ("ep", 1.5), ("cp", True), ("vpp", 0), ("world_size", 0)])
def test_sizes_must_be_positive_integers(field, value):
    key = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "ep": "expert_model_parallel_size",
           "cp": "context_parallel_size", "vpp": "virtual_pipeline_model_parallel_size", "world_size": "world_size"}[field]
    sizes = {"world_size": 4, field: value}
    with pytest.raises(ValueError, match=f"{key} must be a positive integer"):
        ParallelLayout(**sizes)


def test_from_megatron_config_reads_attributes_and_partial_mappings():
    keys = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                context_parallel_size=1, expert_model_parallel_size=2, expert_tensor_parallel_size=None)
    expected = ParallelLayout(world_size=8, tp=2, pp=2, vpp=2, cp=1, ep=2, etp=2)
    assert ParallelLayout.from_megatron_config(SimpleNamespace(**keys), 8) == expected
    assert ParallelLayout.from_megatron_config(OmegaConf.create(keys), 8) == expected
    assert ParallelLayout.from_megatron_config({"tensor_model_parallel_size": 2}, 4) == ParallelLayout(4, tp=2)
    assert ParallelLayout.from_megatron_config({}, 3) == ParallelLayout(3)


def test_from_megatron_transformer_config():
    import torch
    from megatron.core import ModelParallelConfig  # TransformerConfig's parallel part

    config = ModelParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2,
                                 expert_tensor_parallel_size=1, pipeline_dtype=torch.float32)
    assert ParallelLayout.from_megatron_config(config, 8) == ParallelLayout(8, tp=2, pp=2, ep=2, etp=1)


def test_megatron_sizes_use_megatron_names():
    assert ParallelLayout(world_size=8, tp=2, pp=2, vpp=2, ep=2).megatron_sizes() == {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
        "context_parallel_size": 1, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 2,
    }
    assert MEGATRON_ORDER == "tp-cp-ep-dp-pp"  # the numbering coordinates() implements


LAYOUTS = [
    dict(world_size=16, tp=2, pp=4),
    dict(world_size=16, tp=2, pp=2, cp=2),
    dict(world_size=24, tp=2, pp=3, cp=2, ep=2, etp=1),
    dict(world_size=16, tp=4, pp=2, ep=4, etp=1),
    dict(world_size=32, tp=2, pp=2, cp=2, ep=4, etp=2),
]


@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_coordinates_match_megatron_rank_generator(sizes):
    """megatron's RankGenerator (what initialize_model_parallel builds its groups from): along
    each group the layout's index for that axis counts 0, 1, ... and the other indices stay."""
    from megatron.core.parallel_state import RankGenerator

    layout = ParallelLayout(**sizes)
    dense = RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=MEGATRON_ORDER)
    expert = RankGenerator(tp=layout.etp, ep=layout.ep, dp=layout.expert_dp, pp=layout.pp, cp=1, order=MEGATRON_ORDER)
    coords = [layout.coordinates(rank) for rank in range(layout.world_size)]
    axes = {"tp": (dense, "tp"), "cp": (dense, "cp"), "dp": (dense, "dp"), "pp": (dense, "pp"),
            "etp": (expert, "tp"), "ep": (expert, "ep"), "expert_dp": (expert, "dp")}
    for field, (generator, token) in axes.items():
        siblings = [f for f, (g, _) in axes.items() if g is generator and f != field]
        for group in generator.get_ranks(token):
            assert [getattr(coords[r], field) for r in group] == list(range(len(group))), (field, group)
            assert len({tuple(getattr(coords[r], f) for f in siblings) for r in group}) == 1, (field, group)
