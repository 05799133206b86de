"""LoRA on an MoE model (megarl/models/lora.py): adapters on every expert's linear_fc1 / linear_fc2
(megatron's SequentialMLP) as well as the dense MLP and the attention output, against independent
references.

fp32, gloo, tiny Qwen3-MoE (layer 0 dense, layer 1 four experts top-2), rank 4, alpha 8 (scale 2),
every B set to a nonzero value drawn from its adapter's global name:
  * the LoRA actor's log-probs equal HF transformers' forward of the checkpoint merged by hand,
    W + scale * B @ A per linear and per expert, before and after a PPO step; without the expert
    deltas HF's log-probs differ (the expert adapters are in the forward);
  * the merged export is that hand merge; one PPO step changes adapter parameters only (the experts'
    B among them), and the export leaves the base bitwise unchanged;
  * expert parallelism 2 (each rank two experts, their adapters named by the global expert index):
    the same adapters, log-probs, grad norm and merged export (before and after the step) as EP=1;
    its adapter checkpoint loads at EP=1 to the same log-probs.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.dist_utils import run_distributed
from helpers.tiny import PROMPT_LEN, TEMPERATURE, hf_response_log_probs, rollout_batch
from helpers.tiny_hf import VOCAB, build_tiny_qwen3_moe
from lora_bodies import ALPHA, RANK, lora_moe_loaded_log_probs, lora_moe_suite

pytestmark = pytest.mark.slow

SCALE = ALPHA / RANK
EXPERTS = 4


def _batch() -> dict[str, torch.Tensor]:
    """8 rows in the tiny model's vocabulary, row i + 4 as long as row i: each expert-parallel
    rank's micro-batches have the same shapes (megatron's allgather dispatcher on CPU gathers equal ones)."""
    batch = rollout_batch(8)
    for key in ("attention_mask", "position_ids", "response_mask"):
        batch[key][4:] = batch[key][:4]
    batch["input_ids"] = batch["input_ids"] % VOCAB * batch["attention_mask"]
    batch["responses"] = batch["input_ids"][:, PROMPT_LEN:]
    for key in ("advantages", "old_log_probs", "ref_log_prob", "values", "returns"):
        batch[key] = batch[key] * batch["response_mask"]
    return batch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_moe")
    hf_dir = build_tiny_qwen3_moe(root / "model", num_layers=2, num_experts=EXPERTS, mlp_only_layers=(0,))
    return {"root": root, "model_path": str(hf_dir), "batch": _batch()}


@pytest.fixture(scope="module")
def ep1(setup):
    return run_distributed(lora_moe_suite, 1, setup["model_path"], setup["batch"], {}, timeout=400)[0]


def _hf_deltas(adapters: dict, experts: bool = True) -> dict[str, torch.Tensor]:
    """HF tensor name -> scale * B @ A (fp64) of each adapter; megatron's fc1 rows are [gate; up]."""
    out = {}
    for name, ab in adapters.items():
        delta = SCALE * ab["B"].double() @ ab["A"].double()
        parts = name.split(".")  # decoder.layers.<L>.<path>
        layer, path = parts[2], ".".join(parts[3:])
        if path == "self_attention.linear_proj":
            out[f"model.layers.{layer}.self_attn.o_proj.weight"] = delta
            continue
        if path.startswith("mlp.experts.local_experts."):
            if not experts:
                continue
            mlp, linear = f"model.layers.{layer}.mlp.experts.{parts[6]}", parts[7]
        else:
            mlp, linear = f"model.layers.{layer}.mlp", parts[4]
        if linear == "linear_fc2":
            out[f"{mlp}.down_proj.weight"] = delta
        else:
            half = delta.shape[0] // 2
            out[f"{mlp}.gate_proj.weight"], out[f"{mlp}.up_proj.weight"] = delta[:half], delta[half:]
    return out


def _hf_log_probs(setup, tmp_path, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    model_dir = tmp_path / f"merged{len(list(tmp_path.iterdir()))}"
    shutil.copytree(setup["model_path"], model_dir)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(model_dir / "model.safetensors"))
    return hf_response_log_probs(str(model_dir), setup["batch"], TEMPERATURE)[0]


def _close(a, b, atol=1e-5):
    assert (a - b).abs().max() < atol, f"max diff {(a - b).abs().max():.2e}"


@pytest.mark.parametrize("step", [0, 1])
def test_lora_moe_forward_equals_hf_on_the_hand_merged_checkpoint(setup, ep1, tmp_path, step):
    base = load_file(f"{setup['model_path']}/model.safetensors")
    adapters = ep1[f"adapters{step}"]
    assert sum(".local_experts." in n for n in adapters) == 2 * EXPERTS  # fc1 and fc2 of each expert
    deltas = _hf_deltas(adapters)
    assert len(deltas) == 1 + 3 + 1 + 3 * EXPERTS  # o_proj, gate / up / down of layer 0 and of each expert
    merged = {n: (t.double() + deltas[n]).float() if n in deltas else t for n, t in base.items()}
    for name, tensor in ep1[f"merged{step}"].items():  # the export is the hand merge
        _close(tensor, merged[name], atol=1e-6)
        assert name in deltas or torch.equal(tensor, base[name]), name
    assert sorted(ep1[f"merged{step}"]) == sorted(base)
    _close(ep1[f"lp{step}"], _hf_log_probs(setup, tmp_path, merged), atol=5e-5)  # fp32 log-probs down to -17
    if step == 0:  # the expert deltas change the model's output
        dense_only = _hf_deltas(adapters, experts=False)
        without = {n: (t.double() + dense_only[n]).float() if n in dense_only else t for n, t in base.items()}
        assert (ep1["lp0"] - _hf_log_probs(setup, tmp_path, without)).abs().max() > 1e-3


def test_lora_moe_trains_adapters_only(ep1):
    trainable = ep1["trainable"]
    assert trainable and all(".lora." in n for n in trainable)
    assert len(trainable) == 2 * (3 + 1 + 2 * EXPERTS)  # A and B: layer 0 proj, fc1, fc2; layer 1 proj, each expert's fc1, fc2
    changed = ep1["changed"]
    assert changed and all(".lora." in n for n in changed)  # every base tensor bitwise unchanged
    assert any(".local_experts." in n and n.endswith("linear_fc2.lora.B") for n in changed)
    assert any(not torch.equal(ep1["adapters0"][n]["B"], ep1["adapters1"][n]["B"]) for n in ep1["adapters0"]
               if ".local_experts." in n)
    assert (ep1["lp1"] - ep1["lp0"]).abs().max() > 1e-4  # the step moved the policy
    assert ep1["base_unchanged_by_export"]


@pytest.mark.extended  # a 2-rank job
def test_lora_moe_ep2_equals_ep1(setup, ep1):
    ckpt = str(setup["root"] / "ckpt_ep2")
    ranks = run_distributed(lora_moe_suite, 2, setup["model_path"], setup["batch"], {"expert_model_parallel_size": 2},
                            ckpt, timeout=400)
    names = [sorted(n for n in r["adapters0"] if ".local_experts." in n) for r in ranks]
    assert [n.split(".")[6] for n in names[0]] == ["0", "0", "1", "1"]  # global expert indices: 0, 1 on rank 0
    assert [n.split(".")[6] for n in names[1]] == ["2", "2", "3", "3"]
    for r in ranks:
        for name, ab in r["adapters0"].items():  # A drawn from the global name: the same as at EP=1
            assert torch.equal(ab["A"], ep1["adapters0"][name]["A"]), name
        for name, ab in r["adapters1"].items():
            _close(ab["B"], ep1["adapters1"][name]["B"], atol=1e-6)
    lp = {k: torch.cat([ranks[0][k], ranks[1][k]]) for k in ("lp0", "lp1")}  # data parallel: rows split
    for key in ("lp0", "lp1"):
        _close(lp[key], ep1[key])
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(ep1["metrics"]["actor/grad_norm"], rel=1e-4)
    for key in ("merged0", "merged1"):
        assert sorted(ranks[0][key]) == sorted(ep1[key])
        for name, tensor in ep1[key].items():
            _close(ranks[0][key][name], tensor, atol=1e-6)
    # the EP=2 adapter checkpoint (each rank its experts', global index in the key) loads at EP=1
    loaded = run_distributed(lora_moe_loaded_log_probs, 1, setup["model_path"], setup["batch"], {}, ckpt, timeout=400)[0]
    _close(loaded, ep1["lp1"])
