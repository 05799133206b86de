"""megatron's distributed optimizer (`megatron.use_distributed_optimizer`, verl's default) on CPU (gloo).

The reference is the plain (unsharded) optimizer on the same data at the same DP size, and the
uninterrupted run for checkpoints (tiny Qwen2, fp32, Adam, DP=2):
  * each DP rank holds its share of Adam's state, and two steps give the plain optimizer's weights
    and grad norm (Adam's second step reads the first step's moments and step count);
  * saved after the first step in either of verl's formats (`dp_reshardable`; `fully_reshardable`
    with `megatron.dist_ckpt_optim_fully_reshardable`), loaded into a fresh actor at DP=2 (and the
    fully reshardable one at DP=1): the second step equals the uninterrupted second step;
  * bf16 parameters (fp32 main parameters sharded over DP): the plain bf16 optimizer's weights.
"""

from __future__ import annotations

import pytest
import torch

from dist_optim_bodies import FORMATS, bf16_steps, resume, train
from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, rollout_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist_optim")
    model_path = make_tiny_qwen2(str(root / "model"))
    batch = rollout_batch(8)
    ckpts = {fmt: str(root / fmt) for fmt in FORMATS}
    trained = run_distributed(train, 2, model_path, batch, ckpts, timeout=400)
    return {"model_path": model_path, "batch": batch, "ckpts": ckpts, "train": trained,
            "resume_dp2": run_distributed(resume, 2, model_path, batch, ckpts, timeout=300)}


def _assert_weights_close(got: dict, want: dict, atol: float = 1e-6, rtol: float = 1e-5):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol, msg=name)


def test_state_is_sharded_over_dp_and_the_steps_equal_the_plain_optimizer(runs):
    ranks = runs["train"]
    total = ranks[0]["plain"]["param_numel"]
    for fmt in FORMATS:
        shares = [r[fmt]["adam_numel"] for r in ranks]
        assert all(r[fmt]["distributed"] for r in ranks)
        assert sum(shares) == total and max(shares) < total, shares  # each rank holds its part only
        assert all(r["plain"]["adam_numel"] == total for r in ranks)
        want, got = ranks[0]["plain"], ranks[0][fmt]
        _assert_weights_close(got["updated_step2"], want["updated_step2"])
        for step in ("metrics", "metrics_step2"):
            assert got[step]["actor/grad_norm"] == pytest.approx(want[step]["actor/grad_norm"], rel=1e-5)
            assert got[step]["actor/pg_loss"] == pytest.approx(want[step]["actor/pg_loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_resume_at_dp2_equals_the_uninterrupted_step(runs, fmt):
    want = runs["train"][0][fmt]
    got = runs["resume_dp2"][0][fmt]
    _assert_weights_close(got["updated_step2"], want["updated_step2"], atol=0, rtol=0)
    assert got["metrics_step2"]["actor/grad_norm"] == want["metrics_step2"]["actor/grad_norm"]


def test_fully_reshardable_checkpoint_resumes_at_dp1(runs):
    fmt = "fully_reshardable"
    got = run_distributed(resume, 1, runs["model_path"], runs["batch"], {fmt: runs["ckpts"][fmt]}, timeout=300)[0][fmt]
    want = runs["train"][0][fmt]
    _assert_weights_close(got["updated_step2"], want["updated_step2"])


@pytest.mark.extended
def test_bf16_parameters_with_sharded_fp32_main_parameters(runs):
    ranks = run_distributed(bf16_steps, 2, runs["model_path"], runs["batch"], timeout=300)
    plain, sharded = ranks[0][False], ranks[0][True]
    assert sharded["distributed"] and sum(r[True]["adam_numel"] for r in ranks) == plain["adam_numel"]
    # bf16 weights from the same fp32 main weights; DP reduce-scatter vs all-reduce may round differently
    _assert_weights_close(sharded["updated_step2"], plain["updated_step2"], atol=1e-4, rtol=1e-2)
