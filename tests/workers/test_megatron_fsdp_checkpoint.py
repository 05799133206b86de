"""Checkpoints with Megatron-FSDP (`actor.megatron.use_megatron_fsdp=true`) on CPU (gloo), tiny Qwen2,
fp32, Adam, DP=2.

One Adam step, save, a second step: weights W2. A fresh process loads the checkpoint and takes the
same second step: W2 again, bit for bit (the same fp32 operations on the same values in the same
order, gloo's sums included), the weights after loading are those of step 1, every parameter's
Adam step count is 1, and the parameters are still sharded (about 1/2 per rank). A DDP checkpoint
does not load into the FSDP actor (nor FSDP's into DDP): refused naming use_megatron_fsdp.
"""

from __future__ import annotations

import os

import pytest
import torch

from fsdp_bodies import load_refused, load_step, step_save_step
from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, rollout_batch

pytestmark = pytest.mark.slow

KEY = "actor_rollout_ref.actor.megatron.use_megatron_fsdp"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_ckpt")
    model_path, batch = make_tiny_qwen2(str(root / "model")), rollout_batch(8)
    ckpt = str(root / "step1")
    saved = run_distributed(step_save_step, 2, model_path, batch, ckpt, timeout=400)
    resumed = run_distributed(load_step, 2, model_path, batch, ckpt, timeout=400)
    return {"model_path": model_path, "batch": batch, "ckpt": ckpt, "root": root, "saved": saved, "resumed": resumed}


def test_writes_the_fsdp_dtensor_format(run):
    names = os.listdir(os.path.join(run["ckpt"], "fsdp_dtensor"))
    assert ".metadata" in names and "common.pt" in names and not os.path.exists(os.path.join(run["ckpt"], "dist_ckpt"))
    meta = run["resumed"][0]["meta"]
    assert meta["data_parallel"] == "fsdp" and meta["optimizer_format"] == "fsdp_dtensor" and meta["global_step"] == 1


def test_resumed_step_equals_the_uninterrupted_one(run):
    saved, resumed = run["saved"][0], run["resumed"][0]
    for name, tensor in saved["updated_step1"].items():
        assert torch.equal(resumed["loaded"][name], tensor), name
    assert resumed["updated_step2"].keys() == saved["updated_step2"].keys()
    changed = 0
    for name, tensor in saved["updated_step2"].items():
        assert torch.equal(resumed["updated_step2"][name], tensor), name
        changed += not torch.equal(tensor, saved["updated_step1"][name])
    assert changed > len(saved["updated_step2"]) // 2  # the second step moved the weights
    for key in ("actor/grad_norm", "actor/pg_loss"):
        assert resumed["metrics_step2"][key] == saved["metrics_step2"][key], key


def test_optimizer_state_is_restored_sharded(run):
    assert [r["adam_steps_saved"] for r in run["saved"]] == [[1.0], [1.0]]
    assert [r["adam_steps_loaded"] for r in run["resumed"]] == [[1.0], [1.0]]  # a fresh optimizer has none
    shares = [r["local_numel"] for r in run["resumed"]]
    assert max(shares) <= sum(shares) * 0.6, shares


def test_ddp_and_fsdp_checkpoints_do_not_cross(run):
    ddp_ckpt = str(run["root"] / "ddp")
    run_distributed(step_save_step, 2, run["model_path"], run["batch"], ddp_ckpt, False, timeout=400)
    into_fsdp = run_distributed(load_refused, 2, run["model_path"], ddp_ckpt, True, timeout=400)[0]
    assert f"{KEY}=false (dist_ckpt/)" in into_fsdp and f"resume with {KEY}=false" in into_fsdp, into_fsdp
    into_ddp = run_distributed(load_refused, 2, run["model_path"], run["ckpt"], False, timeout=400)[0]
    assert f"{KEY}=true (fsdp_dtensor/)" in into_ddp and f"resume with {KEY}=true" in into_ddp, into_ddp
