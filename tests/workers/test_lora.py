"""LoRA (actor_rollout_ref.model.lora.*) against independent references.

fp32, gloo, tiny Qwen2 (vocab 97: TP=2 pads it), rank 4, alpha 8 (scale 2):
  * B starts at zero: the LoRA actor's log-probs and its reference (adapters off) equal HF
    transformers' forward of the base checkpoint;
  * one PPO step changes only adapter parameters (every base tensor bitwise unchanged; B moves);
    after it the reference is still the base model and the actor's log-probs equal HF's forward
    of the exported merged checkpoint (merged weights == adapter forward);
  * the merged export is W + (alpha / r) B @ A, computed by hand from the HF checkpoint and the
    adapters (o_proj, down_proj, gate/up of layer 0);
  * the checkpoint holds the adapters only (its hf_model export is the merged model); they load
    into a fresh actor to the same log-probs; an actor with another LoRA rank refuses them;
  * extended tier (a 2-rank job): TP=2, with and without sequence parallelism, equals TP=1
    (log-probs, grad norm, merged export), and the TP=1 adapters load at TP=2;
  * with vLLM (ActorRolloutRefWorker, one rank): no reference model is built, the weights streamed
    into vLLM equal W + scale B @ A, vLLM's sampled-token log-probs equal the LoRA actor's (so vLLM
    computes the adapted model), and the sync leaves the base weights bitwise unchanged.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.dist_utils import run_distributed
from lora_bodies import ALPHA, RANK, lora_actor_suite, lora_hybrid_sync
from helpers.tiny import hf_response_log_probs, make_tiny_qwen2, megatron_node, rollout_batch
from helpers.tiny import TEMPERATURE

pytestmark = pytest.mark.slow

SCALE = ALPHA / RANK


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {"root": root, "model_path": make_tiny_qwen2(str(root / "model")), "batch": rollout_batch(8),
            "ckpt": str(root / "ckpt_tp1")}


@pytest.fixture(scope="module")
def tp1(setup):  # saves its adapters after the step, then loads them into a fresh actor
    return run_distributed(lora_actor_suite, 1, setup["model_path"], setup["batch"], {"tp1": megatron_node()},
                           setup["ckpt"], setup["ckpt"], timeout=400)[0]


@pytest.fixture(scope="module")
def tp2(setup, tp1):  # after tp1: loads its checkpoint at TP=2
    layouts = {"tp2": megatron_node(tensor_model_parallel_size=2),
               "tp2sp": megatron_node(tensor_model_parallel_size=2, sequence_parallel=True)}
    return run_distributed(lora_actor_suite, 2, setup["model_path"], setup["batch"], layouts, None, setup["ckpt"],
                           timeout=400)


def _close(a, b, atol=1e-5):
    assert (a - b).abs().max() < atol, f"max diff {(a - b).abs().max():.2e}"


def test_lora_trains_adapters_only_and_reference_is_the_base(setup, tp1):
    hf_lp, _ = hf_response_log_probs(setup["model_path"], setup["batch"], TEMPERATURE)
    res = tp1["tp1"]
    assert res["trainable"] and all(".lora." in n for n in res["trainable"])
    assert len(res["trainable"]) == 2 * 4 * 4  # A and B of qkv, proj, fc1, fc2 in each of 4 layers
    _close(res["lp0"], hf_lp)  # B = 0: the adapted model is the base model
    _close(res["ref0"], hf_lp)
    assert res["changed"] and all(".lora." in n for n in res["changed"])  # base bitwise unchanged
    assert any(n.endswith(".lora.B") for n in res["changed"])
    _close(res["ref1"], hf_lp)  # the reference stays the base model
    assert (res["lp1"] - hf_lp).abs().max() > 1e-3  # the step moved the policy
    assert res["base_unchanged_by_export"]


def test_merged_export_is_w_plus_scaled_ba_and_forwards_like_the_adapters(setup, tp1, tmp_path):
    res = tp1["tp1"]
    merged, base = res["merged"], load_file(f"{setup['model_path']}/model.safetensors")
    adapters = res["layer0"]
    delta = {path: SCALE * ab["B"].double() @ ab["A"].double() for path, ab in adapters.items()}
    half = delta["mlp.linear_fc1"].shape[0] // 2  # megatron's fc1 rows: [gate; up]
    expected = {
        "model.layers.0.self_attn.o_proj.weight": delta["self_attention.linear_proj"],
        "model.layers.0.mlp.down_proj.weight": delta["mlp.linear_fc2"],
        "model.layers.0.mlp.gate_proj.weight": delta["mlp.linear_fc1"][:half],
        "model.layers.0.mlp.up_proj.weight": delta["mlp.linear_fc1"][half:],
    }
    for name, d in expected.items():
        assert d.abs().max() > 1e-4, name  # B moved: a real change
        _close(merged[name].double(), base[name].double() + d, atol=1e-6)
    untouched = [n for n in base if "norm" in n or "embed" in n or n == "lm_head.weight"]
    assert untouched and all(torch.equal(merged[n], base[n]) for n in untouched)
    # HF transformers on the merged checkpoint = the LoRA actor (adapter forward)
    merged_dir = tmp_path / "merged"
    shutil.copytree(setup["model_path"], merged_dir)
    save_file({k: v.contiguous() for k, v in merged.items()}, str(merged_dir / "model.safetensors"))
    hf_merged, _ = hf_response_log_probs(str(merged_dir), setup["batch"], TEMPERATURE)
    _close(res["lp1"], hf_merged)


@pytest.mark.extended  # a 2-rank job (~40 s on 2 cores)
@pytest.mark.parametrize("layout", ["tp2", "tp2sp"])
def test_lora_tp2_equals_tp1(tp1, tp2, layout):
    ref, res = tp1["tp1"], tp2[0][layout]
    for key in ("lp0", "ref0", "lp1", "ref1"):
        _close(res[key], ref[key])
    assert res["metrics"]["actor/grad_norm"] == pytest.approx(ref["metrics"]["actor/grad_norm"], rel=1e-4)
    assert res["changed"] and all(".lora." in n for n in res["changed"])
    assert sorted(res["merged"]) == sorted(ref["merged"])
    for name, tensor in ref["merged"].items():
        _close(res["merged"][name], tensor, atol=1e-5)


def test_adapter_only_checkpoint_loads_and_refuses_another_rank(setup, tp1):
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(f"{setup['ckpt']}/dist_ckpt").read_metadata().state_dict_metadata
    model_keys = [k for k in keys if not k.startswith(("optimizer", "rng_state", "common_state"))]  # 0.19: common state
    assert model_keys and all(".lora." in k for k in model_keys), model_keys[:5]
    exported = load_file(f"{setup['ckpt']}/huggingface/model.safetensors")  # save_contents hf_model: merged
    assert sorted(exported) == sorted(tp1["tp1"]["merged"])
    assert all(torch.equal(exported[n], t) for n, t in tp1["tp1"]["merged"].items())
    _close(tp1["loaded_lp"], tp1["tp1"]["lp1"])
    assert "another base model or adapter shape" in tp1["other_rank_error"]


@pytest.mark.extended
def test_adapter_checkpoint_tp1_loads_at_tp2(tp1, tp2):
    """The adapters saved at TP=1 load at TP=2 (B / A resharded, a gated fc1's B split as megatron's W)."""
    _close(tp2[0]["loaded_lp"], tp1["tp1"]["lp1"])


def test_lora_vllm_sync_gets_merged_weights(tmp_path):
    from helpers.tiny_hf import build_tiny_qwen2

    hf_dir = build_tiny_qwen2(tmp_path / "qwen2")
    res = run_distributed(lora_hybrid_sync, 1, str(hf_dir), [[5, 6, 7], [11, 12, 13, 14, 15]], 0.7, timeout=600)[0]
    assert not res["has_ref_model"]  # the reference is the actor without adapters
    base = load_file(f"{hf_dir}/model.safetensors")
    for hf_name, path in (("self_attn.o_proj.weight", "self_attention.linear_proj"),
                          ("mlp.down_proj.weight", "mlp.linear_fc2")):
        ab = res["adapters"][path]
        expected = base[f"model.layers.0.{hf_name}"].double() + SCALE * ab["B"].double() @ ab["A"].double()
        _close(res["streamed"][hf_name].double(), expected, atol=1e-6)  # what vLLM's reload_weights got
    mask = res["sampled"]["response_mask"].bool()
    gap = (res["sampled"]["rollout_log_probs"] - res["old_log_probs"]).abs()[mask]
    assert gap.max() < 1e-4, f"max |vLLM - LoRA actor| = {gap.max():.2e}"
    assert (res["ref_log_prob"] - res["old_log_probs"]).abs()[mask].max() > 1e-3  # the reference is the base
    assert res["base_unchanged"]
    assert res["sync"]["weight_sync/bytes"] > 0


def test_lora_keys_change_what_is_adapted(tp1):
    """target_modules / exclude_modules pick the layers (names, or fnmatch patterns over global
    names), lora_A_init_method A's distribution; a typo or an empty selection is an error."""
    fx = tp1["key_effects"]
    default = fx["default"]["names"]
    assert len(default) == 16 and {n.rsplit(".", 1)[1] for n in default} == {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
    assert fx["qkv_only"]["names"] == [f"decoder.layers.{i}.self_attention.linear_qkv" for i in range(4)]
    assert fx["pattern"]["names"] == [n for n in default if n.startswith("decoder.layers.1.")]
    assert fx["exclude"]["names"] == [n for n in default if not n.startswith("decoder.layers.0.") and not n.endswith("linear_fc2")]
    a = {k: fx[k]["A"]["decoder.layers.0.self_attention.linear_qkv"] for k in ("default", "kaiming", "normal")}
    fan_in = a["default"].shape[1]  # hidden 32; A is [rank 4, 32]
    assert a["kaiming"].abs().max() <= 1 / fan_in ** 0.5  # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
    assert a["normal"].std() == pytest.approx(0.02, rel=0.3)
    assert a["default"].std() == pytest.approx((2 / (RANK + fan_in)) ** 0.5, rel=0.3)  # xavier normal
    assert "['linear_qkvv'] name no layer of this model" in fx["typo"] and "linear_qkv" in fx["typo"]
    assert "leave no layer" in fx["nothing"]
