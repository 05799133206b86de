"""Megatron's CPU optimizer (`optim.override_optimizer_config.optimizer_cpu_offload`, its HybridDeviceOptimizer)
through megarl's actor and critic, on CPU (gloo).

megatron-core's hybrid optimizer needs a CUDA driver to be built (streams, page-locked copies) and splits only
CUDA parameters; megarl.compat.megatron_core.hybrid_optimizer runs it on CPU with the same split (its parameters
report is_cuda while it splits them). With verl's keys (optimizer_cpu_offload, optimizer_offload_fraction,
overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer), bf16 parameters, Adam, at TP=1 and TP=2:
  * two steps give the plain distributed optimizer's weights (fp32 main weights and moments either way) at
    fraction 1 (every parameter's state on the host) and 0.5 (split by elements), also with megarl's own
    optimizer/parameter offload between phases, which moves only the device part of the state;
  * it holds 16 bytes a parameter on the host and 12 on the device, the plan's figures (megarl.plan.memory);
  * saved after the first step (dp_reshardable, and fully_reshardable), a fresh actor that loads it takes the
    uninterrupted second step bit for bit, and keeps counting steps in a device Adam that counts them per
    param group (TE's FusedAdam);
  * the critic's values after two steps equal the plain optimizer's;
  * the keys megatron-core 0.19.2 cannot honour with it are refused by key, before any worker starts.
"""

from __future__ import annotations

import pytest
import torch

from cpu_offload_bodies import CASES, critic_steps, group_step_resume, resume, train
from helpers.cpu_config import CPU_SMALL
from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, rollout_batch

from megarl.config import collect_issues, load_config

O = "actor_rollout_ref.actor.optim"
OV = f"{O}.override_optimizer_config"
M = "actor_rollout_ref.actor.megatron"
CPU_CASES = [c for c in CASES if c != "plain"]
# TP=1 is TP=2's check without the shard: a further case, left to -m extended (the default tier's time)
TPS = [pytest.param(1, marks=pytest.mark.extended), 2]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_tiny_qwen2(str(tmp_path_factory.mktemp("cpu_offload") / "model"))


@pytest.fixture(scope="module")
def runs(model_path, tmp_path_factory):
    batch = rollout_batch(8)
    out = {}

    def get(tp: int) -> dict:
        if tp not in out:
            root = str(tmp_path_factory.mktemp(f"ckpt_tp{tp}"))
            out[tp] = {"train": run_distributed(train, tp, model_path, batch, tp, root, timeout=600)[0],
                       "resume": run_distributed(resume, tp, model_path, batch, tp, root, timeout=600)[0]}
        return out[tp]

    return get


def _assert_weights(got: dict, want: dict, **tolerance) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name, **tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("case", CPU_CASES)
def test_steps_equal_the_plain_optimizer(runs, tp, case):
    train_out = runs(tp)["train"]
    plain, got = train_out["plain"], train_out[case]
    moved = [n for n in plain["initial"] if not torch.equal(plain["updated_step2"][n], plain["initial"][n])]
    assert len(moved) == len(plain["initial"])  # every weight moved: the comparison below means something
    # bf16 weights from fp32 main weights and moments on both sides (torch's fused AdamW vs its foreach one)
    _assert_weights(got["updated_step2"], plain["updated_step2"], atol=1e-4, rtol=1e-2)
    assert got["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("tp", TPS)
def test_the_fraction_splits_the_state_and_offload_moves_only_the_device_part(runs, tp):
    train_out = runs(tp)["train"]
    whole = train_out["cpu_f1"]["split"]
    assert whole["device_numel"] == 0 and not whole["device_state_bytes"] and whole["host_numel"] > 0
    assert whole["host_grads_exact"] and whole["host_grads_before_first_step"]
    total = whole["host_numel"]
    for case in ("cpu_f05", "cpu_f05_offload"):
        split = train_out[case]["split"]
        assert split["host_numel"] + split["device_numel"] == total
        # parameters go to the host in order until half of the elements are there
        assert total / 2 <= split["host_numel"] < total / 2 + split["largest"]
        assert split["host_grads_exact"] and all(split["host_state_bytes"])  # the host part never moves
    # what the hybrid optimizer holds per element of its share, as megarl.plan.memory counts it: 16 bytes on the
    # host (fp32 main param, exp_avg, exp_avg_sq, gradient copy), 12 on the device (fp32 copy, exp_avg, exp_avg_sq)
    for split in (whole, train_out["cpu_f05"]["split"]):
        assert split["host_bytes"] == 16 * split["host_numel"]
        assert split["device_bytes"] == 12 * split["device_numel"]
    assert all(train_out["cpu_f05"]["split"]["device_state_bytes"])
    assert not any(train_out["cpu_f05_offload"]["split"]["device_state_bytes"])  # megarl's optimizer_offload


@pytest.mark.slow
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("case", CPU_CASES)
def test_resume_equals_the_uninterrupted_step(runs, tp, case):
    want, got = runs(tp)["train"][case], runs(tp)["resume"][case]
    _assert_weights(got["updated_step2"], want["updated_step2"], atol=0, rtol=0)
    assert got["grad_norm"] == want["grad_norm"][1]


@pytest.mark.slow
def test_resume_keeps_counting_the_device_optimizers_steps(model_path, tmp_path):
    """TransformerEngine's FusedAdam (the GPU part's optimizer) counts steps in its param group; the loaded param
    groups carry the checkpoint's step, which the hybrid optimizer copies into its sub-optimizers' groups before
    every step: unless megarl drops it, the count stays at the saved step + 1 (a frozen bias correction)."""
    out = run_distributed(group_step_resume, 1, model_path, rollout_batch(8), str(tmp_path / "ckpt"), timeout=600)[0]
    assert out["device_steps"] and set(out["device_steps"]) == {3}
    _assert_weights(out["resumed"], out["uninterrupted"], atol=0, rtol=0)


@pytest.mark.slow
def test_critic_steps_equal_the_plain_optimizer(model_path):
    out = run_distributed(critic_steps, 1, model_path, rollout_batch(8), timeout=600)[0]
    plain, hybrid = out["plain"], out["cpu_f05"]
    assert hybrid["hybrid"] == "HybridDeviceOptimizer" and plain["hybrid"] != hybrid["hybrid"]
    assert not torch.allclose(plain["after"], plain["before"], atol=1e-3)
    torch.testing.assert_close(hybrid["after"], plain["after"], atol=1e-3, rtol=1e-2)


# ---------------------------------------------------------------- no model: the config rules

VERL = [f"+{OV}.optimizer_cpu_offload=true", f"+{OV}.optimizer_offload_fraction=1",
        f"+{OV}.overlap_cpu_optimizer_d2h_h2d=true", f"+{OV}.use_precision_aware_optimizer=true",
        f"{M}.use_distributed_optimizer=true", f"{M}.dtype=bfloat16"]


def _issues(*overrides: str) -> dict[str, str]:
    return {i.key: i.problem + " | " + i.fix for i in collect_issues(load_config([*CPU_SMALL, *overrides])) if ".optim." in i.key}


def _without(keys: list[str], *names: str) -> list[str]:
    return [k for k in keys if not any(name in k for name in names)]


def test_verls_keys_accepted_on_cpu_without_transformer_engine():
    # the hybrid optimizer keeps the fp32 main weights itself: the precision-aware optimizer needs neither
    # TE's FusedAdam nor CUDA with it
    assert not _issues(*VERL)
    assert f"{O}.use_precision_aware_optimizer" in _issues(*_without(VERL, "optimizer_cpu_offload", "fraction", "overlap"))


def test_what_megatron_cannot_run_is_refused_by_key():
    cases = {
        f"{OV}.optimizer_offload_fraction": ([*_without(VERL, "fraction")], "(0, 1]"),  # Megatron's default 0
        f"{OV}.optimizer_offload_fraction ": ([*_without(VERL, "fraction"), f"+{OV}.optimizer_offload_fraction=1.5"], "(0, 1]"),
        f"{OV}.optimizer_cpu_offload": ([*_without(VERL, "use_distributed_optimizer"), f"{M}.use_distributed_optimizer=false"],
                                        f"{M}.use_distributed_optimizer=true"),
        f"{OV}.optimizer_cpu_offload ": (_without(VERL, "use_precision_aware"), f"{O}.use_precision_aware_optimizer=true"),
        f"{O}.exp_avg_dtype": ([*VERL, f"{O}.exp_avg_dtype=bf16"], "fp32"),
    }
    for key, (overrides, fix) in cases.items():
        issues = _issues(*overrides)
        assert fix in issues[key.strip()], (key, issues)


def test_cpu_optimizer_settings_without_it_are_refused():
    issues = _issues(f"+{OV}.optimizer_offload_fraction=0.5", f"+{OV}.overlap_cpu_optimizer_d2h_h2d=true")
    for name in ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"):
        assert "optimizer_cpu_offload=true" in issues[f"{OV}.{name}"]
    assert not _issues(f"+{OV}.optimizer_offload_fraction=0")  # Megatron's default
