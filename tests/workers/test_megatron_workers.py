"""Megatron actor/ref/critic workers against HF transformers and against TP=1 runs.

Checks (fp32, gloo, tiny Qwen2 with vocab 97 so TP=2 pads the vocabulary):
  * log-probs / entropy / ref log-probs and the actor's sum_pi_squared (sum over the vocabulary
    of softmax^2, actor.calculate_sum_pi_squared) at TP=1, TP=2, PP=2, PP=2 x VPP=2 equal HF
    transformers' forward with logits / temperature (temperature 0.7), atol 1e-5;
  * one PPO step (clip + entropy bonus + in-loss KL, grad clipping active) at TP=2 (also with
    sequence parallelism on megatron's torch norms), PP=2 and DP=2 gives the same HF-exported weights and grad norm as TP=1 (VPP=2 as well). The tests use
    SGD with momentum: Adam's first step is sign(grad) * lr and would hide a wrongly
    scaled gradient (e.g. a per-micro-batch instead of a global denominator);
  * micro-batch 1 vs 4 vs token-budget (thd packed) micro-batches: same weights;
  * PP=2 x VPP=2 on micro-batches of different shapes (thd packing, dynamic batch size, both),
    which run_schedule pads to one: the step equals TP=1's on one micro-batch (and a critic step
    with both equals TP=1's);
  * save at TP=2 (or CP=2) -> load at TP=1: same log-probs, and the second step equals the
    uninterrupted second step (optimizer + lr scheduler restored); a reference model
    initialised from it (megatron.use_dist_checkpointing) gives the same log-probs;
  * critic values equal HF backbone hidden states x the value head; one critic step at
    TP=2 equals TP=1;
  * context parallelism (CP=2 on the SDPA spec, padded and thd-packed): log-probs / values
    equal HF, one actor and one critic step equal TP=1 (weights, global-denominator losses and
    grad norm);
  * offload/onload frees and restores params, grads and optimizer state exactly.
"""

from __future__ import annotations

import functools

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny import hf_response_log_probs, hf_response_sum_pi_squared, hf_values, make_tiny_qwen2, megatron_node, rollout_batch
from helpers.tiny import TEMPERATURE
from worker_bodies import VPP_VARIANTS, actor_and_critic, resume_from_checkpoint, tp1_suite, vpp_variants

pytestmark = pytest.mark.slow

# name -> (world size, megatron node, actor overrides[, model.use_remove_padding])
LAYOUTS = {
    # context parallelism on the SDPA spec (megarl.models.cp_attention): each rank holds 2 of the 4
    # load-balanced chunks of every row; padded rows, and thd packing (rows padded to 2 x cp each)
    "cp2": (2, megatron_node(context_parallel_size=2), {}),
    "cp2packed": (2, megatron_node(context_parallel_size=2), {}, True),
    "tp2": (2, megatron_node(tensor_model_parallel_size=2), {}),
    # sequence parallel with megatron's torch norms (no transformer-engine): norm weights get a
    # gradient from their rank's sequence shard only and must be all-reduced over TP
    "tp2sp": (2, megatron_node(tensor_model_parallel_size=2, sequence_parallel=True), {}),
    "pp2": (2, megatron_node(pipeline_model_parallel_size=2), {}),
    "dp2": (2, megatron_node(), {}),
    # Interleaved schedule: 2 stages x 2 model chunks of the 4 layers; it needs at least
    # pp micro-batches per step (the split does not change the result, see below).
    "vpp2": (
        2,
        megatron_node(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
        {"ppo_micro_batch_size_per_gpu": 4},
    ),
}


_SAVED = ("tp2", "cp2")  # layouts whose run saves a checkpoint (then a second step)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_workers")
    model_path = make_tiny_qwen2(str(root / "model"))
    return {"model_path": model_path, "batch": rollout_batch(8), "ckpt": {name: str(root / f"ckpt_{name}") for name in _SAVED}}


@pytest.fixture(scope="module")
def runs(setup):
    """Lazily run (and cache) each layout once per module."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            if name == "tp1":
                cache[name] = run_distributed(tp1_suite, 1, setup["model_path"], setup["batch"], timeout=400)
            elif name == "vpp2_variants":
                world, megatron, _ = LAYOUTS["vpp2"]
                cache[name] = run_distributed(vpp_variants, world, setup["model_path"], setup["batch"], megatron, timeout=400)
            elif name.startswith("resume_tp1_from_"):
                saved = name.removeprefix("resume_tp1_from_")
                get(saved)  # writes the checkpoint
                cache[name] = run_distributed(
                    resume_from_checkpoint, 1, setup["model_path"], setup["batch"], megatron_node(), setup["ckpt"][saved],
                    timeout=300,
                )
            else:
                world, megatron, overrides, *packed = LAYOUTS[name]
                ckpt = setup["ckpt"].get(name)
                cache[name] = run_distributed(
                    actor_and_critic, world, setup["model_path"], setup["batch"], megatron, ckpt, overrides, *packed,
                    timeout=600,
                )
        return cache[name]

    return get


def _main(runs, name):
    return [r["main"] for r in runs(name)] if name == "tp1" else runs(name)


def _assert_weights_close(got: dict, want: dict):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", ["tp1", "tp2", "tp2sp", "pp2", "vpp2", "cp2", "cp2packed"])
def test_log_probs_match_hf(setup, runs, layout):
    want_logp, want_ent = hf_response_log_probs(setup["model_path"], setup["batch"], TEMPERATURE)
    want_spp = hf_response_sum_pi_squared(setup["model_path"], setup["batch"], TEMPERATURE)
    for rank_out in _main(runs, layout):  # every rank returns the same, full result
        torch.testing.assert_close(rank_out["log_probs"], want_logp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_out["entropys"], want_ent, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_out["sum_pi_squared"], want_spp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rank_out["ref_log_prob"], want_logp, atol=1e-5, rtol=1e-5)
        assert rank_out["ref_keys"] == ["ref_log_prob"]  # calculate_sum_pi_squared is the actor's


@pytest.mark.parametrize("layout", ["tp2", "tp2sp", "pp2", "dp2", "vpp2", "cp2", "cp2packed"])
def test_ppo_step_matches_tp1(setup, runs, layout):
    from safetensors.torch import load_file

    want = _main(runs, "tp1")[0]
    got = _main(runs, layout)[0]
    initial = load_file(f"{setup['model_path']}/model.safetensors")
    moved = max((want["updated"][k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-3, "the PPO step did not change the weights"
    _assert_weights_close(got["updated"], want["updated"])
    # Global-denominator shares and the grad norm are exact; per-micro-batch means such as
    # ppo_kl are averaged unweighted over DP ranks (as verl does), so not compared.
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-4, abs=1e-6), key


def test_micro_batch_split_invariance(runs):
    split = runs("tp1")[0]["split"]
    for variant in ("micro4", "dynamic"):
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
            assert split[f"{variant}_metrics"][key] == pytest.approx(split["micro1_metrics"][key], rel=1e-5), key
    _assert_weights_close(split["micro4"], split["micro1"])
    _assert_weights_close(split["dynamic"], split["micro1"])


@pytest.mark.parametrize("variant", list(VPP_VARIANTS))
def test_vpp_variable_shapes_match_tp1(runs, variant):
    """PP=2 x VPP=2 with thd packing and/or dynamic batch size: the micro-batches' shapes differ,
    run_schedule pads them to one (megatron's interleaved schedule hangs otherwise); the step
    equals TP=1 on one micro-batch of padded rows (weights, global-denominator losses, grad norm)."""
    want = runs("tp1")[0]["split"]
    got = runs("vpp2_variants")
    passes = got[-1][f"{variant}_shapes"]  # the last pipeline stage's run_schedule training passes
    assert passes and all(len(set(padded)) == 1 for _, padded in passes)
    assert any(len(set(given)) > 1 for given, _ in passes), "no pass had micro-batches of different shapes"
    _assert_weights_close(got[0][variant], want["micro1"])
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert got[-1][f"{variant}_metrics"][key] == pytest.approx(want["micro1_metrics"][key], rel=1e-4, abs=1e-6), key


def test_vpp_critic_step_with_dynamic_batch_and_packing_matches_tp1(runs):
    want = _main(runs, "tp1")[0]
    got = runs("vpp2_variants")[-1]
    assert any(len(set(given)) > 1 for given, _ in got["critic_shapes"]), "no pass had micro-batches of different shapes"
    torch.testing.assert_close(got["critic_values_after"], want["critic_values_after"], atol=1e-5, rtol=1e-5)
    # vf_clipfrac is a per-micro-batch mean averaged over micro-batches: it depends on the split.
    for key in ("critic/vf_loss", "critic/grad_norm"):
        assert got["critic_metrics"][key] == pytest.approx(want["critic_metrics"][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("saved_at", _SAVED)
def test_checkpoint_to_tp1(runs, saved_at):
    """Saved at TP=2 (or CP=2: parameters replicated over CP ranks), loaded at TP=1."""
    saved = runs(saved_at)[0]
    resumed = runs(f"resume_tp1_from_{saved_at}")[0]
    torch.testing.assert_close(resumed["log_probs"], saved["log_probs_after_step"], atol=1e-5, rtol=1e-5)
    _assert_weights_close(resumed["updated_step2"], saved["updated_step2"])
    assert resumed["metrics_step2"]["actor/lr"] == saved["metrics_step2"]["actor/lr"]
    torch.testing.assert_close(resumed["ref_from_ckpt"], saved["log_probs_after_step"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["tp1", "tp2", "tp2sp", "cp2", "cp2packed"])
def test_critic_values_match_hf(setup, runs, layout):
    outs = _main(runs, layout)
    head = outs[0]["value_head"]
    want = hf_values(setup["model_path"], setup["batch"], head)
    for rank_out in outs:
        torch.testing.assert_close(rank_out["values"], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["tp2", "tp2sp", "cp2", "cp2packed"])
def test_critic_step_tp2_matches_tp1(runs, layout):
    want = _main(runs, "tp1")[0]
    got = _main(runs, layout)[0]
    torch.testing.assert_close(got["value_head"], want["value_head"])
    assert not torch.allclose(want["critic_values_after"], want["values"], atol=1e-4)
    torch.testing.assert_close(got["critic_values_after"], want["critic_values_after"], atol=1e-5, rtol=1e-5)
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"):
        assert got["critic_metrics"][key] == pytest.approx(want["critic_metrics"][key], rel=1e-4, abs=1e-6), key


def test_offload_roundtrip(runs):
    off = runs("tp1")[0]["offload"]
    assert off["freed_at_init"] and off["freed_after_update"]  # the configured state lives on the host between phases
    assert off["freed"] and off["grads_freed"] and off["still_freed"]  # param_offload: params and grads
    assert off["params_only"]  # a forward onloads the parameters, not the gradients or the optimizer state
    assert off["params_equal"] and off["opt_equal"]
    assert torch.equal(off["before"], off["during"])


def test_megatron_use_remove_padding_false_pads_as_the_model_key_does(runs):
    """The padded rows of megatron.use_remove_padding=false give the log-probs of the padded run
    (model.use_remove_padding=false, the suite's default); packing gives them within rounding."""
    want = _main(runs, "tp1")[0]["log_probs"]
    out = runs("tp1")[0]["padding"]
    assert out["padded_remove_padding"] is False and out["packed_remove_padding"] is True
    torch.testing.assert_close(out["padded_log_probs"], want, atol=0, rtol=0)
    torch.testing.assert_close(out["packed_log_probs"], want, atol=1e-5, rtol=1e-5)


def test_grad_offload_moves_the_gradients_alone(runs):
    out = runs("tp1")[0]["grad_offload"]
    assert out["grads_at_init"] and all(n == 0 for n in out["grads_at_init"])
    assert all(n > 0 for n in out["params_at_init"])
    assert all(n == 0 for n in out["grads_after_update"]) and out["trained"]
