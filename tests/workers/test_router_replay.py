"""MoE routing replay on a tiny Qwen3-MoE (4 layers, the first dense, 8 experts, top-2) on 2 ranks, the
colocated worker end to end with verl's keys: vLLM generates and records its routes, megatron's routers
are perturbed (so that their own choice differs from vLLM's), then the old-log-prob, reference and update
passes run.

The reference is independent of the replay code: hooks on megatron's routers see the routing map each
router returns and map it to (row, position) from first principles (replay_bodies.routes_by_position), and
those experts are compared with vLLM's (R3, captured by the rollout) or the old-log-prob pass's (R2). The
reference pass runs the same perturbed weights with its replay turned off (ref.megatron.router_replay.mode=
disabled): it must differ, so a replay that were ignored fails the test, and its log-prob gap to vLLM is the
gap without replay.
"""

from __future__ import annotations

import pytest

from helpers.dist_utils import run_distributed
from helpers.tiny_hf import build_tiny_qwen3_moe
from replay_bodies import compare, replay_pass, unrouted_positions

pytestmark = pytest.mark.slow

ROWS = [[5, 6, 7], [11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34, 35, 36]]
BASE = {
    "rollout.tensor_model_parallel_size": 1, "rollout.n": 2, "rollout.ignore_eos": True,
    "ref.megatron.router_replay.mode": "disabled",
    "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 16,
    "rollout.log_prob_micro_batch_size_per_gpu": 16, "ref.log_prob_micro_batch_size_per_gpu": 16,
}
R3 = {"actor.megatron.router_replay.mode": "R3", "rollout.enable_rollout_routing_replay": True}
R2 = {"actor.megatron.router_replay.mode": "R2"}
EP2 = {"actor.megatron.expert_model_parallel_size": 2, "model.use_remove_padding": True}
PP2 = {"actor.megatron.pipeline_model_parallel_size": 2}
TP2_SP = {"actor.megatron.tensor_model_parallel_size": 2, "actor.megatron.sequence_parallel": True,
          "ref.megatron.sequence_parallel": True, "model.use_remove_padding": True}
CP2 = {"actor.megatron.context_parallel_size": 2}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("replay_qwen3_moe"), num_layers=4, num_experts=8,
                                mlp_only_layers=(0,))


def _check_r3(results):
    unrouted = set()
    for rank, res in enumerate(results):
        for name in ("old_pass", "update_pass"):
            compared, equal, _ = compare(res[name], res["routes"])
            assert compared > 50 and equal == compared, f"rank {rank} {name}: {equal}/{compared} tokens on vLLM's experts"
            unrouted |= unrouted_positions(res[name], res["routes"], res["attention_mask"])
        compared, equal, _ = compare(res["ref_pass"], res["routes"])
        assert equal < 0.9 * compared, f"rank {rank}: native routing equals vLLM's on {equal}/{compared} tokens"
        assert res["gap"]["replayed"].mean() < res["gap"]["native"].mean(), f"rank {rank}: replay did not close the gap"
        metrics = {**res["old_metrics"], **res["update_metrics"]}
        assert 0 < metrics["router_replay/old_log_prob/native_frac"] < 0.2  # the rows' last tokens
        assert metrics["router_replay/old_log_prob/differs_frac"] > 0.1  # the perturbation: routers disagree
        assert metrics["router_replay/update/native_frac"] == metrics["router_replay/old_log_prob/native_frac"]
        assert res["rollout_metrics"]["rollout/routed_experts_missing_frac"] == 0.0
    # the last token of each row has no vLLM route (never fed forward): routed natively, and nothing else is
    assert unrouted == {"last"}


@pytest.mark.parametrize("layout", [EP2, PP2], ids=["ep2_packed", "pp2_padded"])
def test_r3_megatron_routes_every_token_to_vllms_experts(moe_dir, layout):
    _check_r3(run_distributed(replay_pass, 2, str(moe_dir), {**BASE, **R3, **layout}, ROWS, timeout=900))


@pytest.mark.extended
@pytest.mark.parametrize("layout", [TP2_SP, CP2], ids=["tp2_sp_packed", "cp2_padded"])
def test_r3_under_sequence_and_context_parallelism(moe_dir, layout):
    _check_r3(run_distributed(replay_pass, 2, str(moe_dir), {**BASE, **R3, **layout}, ROWS, timeout=900))


@pytest.mark.parametrize("layout", [EP2, pytest.param(PP2, marks=pytest.mark.extended)], ids=["ep2", "pp2"])
def test_r2_update_replays_the_old_log_prob_routes(moe_dir, layout):
    """R2 records the old-log-prob pass's routes; after a further change of the routers the update still
    sends every token to them (the reference, changed alike and routing natively, does not)."""
    for rank, res in enumerate(run_distributed(replay_pass, 2, str(moe_dir), {**BASE, **R2, **layout}, ROWS, timeout=900)):
        compared, equal, without = compare(res["old_pass"], res["routes"])
        assert compared > 50 and equal == compared and without == 0, f"rank {rank}: recorded {equal}/{compared}"
        compared, equal, without = compare(res["update_pass"], res["routes"])
        assert equal == compared and without == 0, f"rank {rank}: update replayed {equal}/{compared}"
        compared, equal, _ = compare(res["ref_pass"], res["routes"])
        assert equal < 0.9 * compared, f"rank {rank}: the changed routers still choose alike ({equal}/{compared})"
        assert res["update_metrics"]["router_replay/update/differs_frac"] > 0.1
        assert "rollout/routed_experts_missing_frac" not in res["rollout_metrics"]  # the rollout recorded nothing
