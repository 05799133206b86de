"""Megatron-FSDP (`actor.megatron.use_megatron_fsdp=true`) on CPU (gloo), tiny Qwen2, fp32, Adam, DP=2.

The reference is the same actor wrapped in megatron-core's DDP with the distributed optimizer, on the
same rows: FSDP changes where parameters live, not the math.
  * each DP rank stores about half of the parameters (DDP: all of them), before and after the steps
    (the HF export in between gathers them and gives them back);
  * two Adam steps give DDP's exported weights, losses and grad norms.
"""

from __future__ import annotations

import pytest
import torch

from fsdp_bodies import two_steps
from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, rollout_batch

pytestmark = pytest.mark.slow

# Softmax is invariant to the key bias (it adds q.b_k to every score of a row), so its gradient is rounding
# noise, which Adam's m / sqrt(v) scales to a full lr-sized step whose last digits follow the reduction order
# (DDP's all-reduce vs FSDP's reduce-scatter): 1-3e-6 apart on an Intel Xeon after two 1e-2 steps. A shard
# mix-up would be lr-sized (1e-2) apart.
KEY_BIAS_ATOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    model_path = make_tiny_qwen2(str(tmp_path_factory.mktemp("fsdp") / "model"))
    batch = rollout_batch(8)
    return {fsdp: run_distributed(two_steps, 2, model_path, batch, fsdp, timeout=400) for fsdp in (False, True)}


def test_parameters_are_sharded_over_dp(runs):
    ddp, fsdp = runs[False], runs[True]
    assert [r["wrapper"] for r in fsdp] == ["FullyShardedDataParallel"] * 2
    total = ddp[0]["local_numel"]
    assert all(r["local_numel"] == total for r in ddp)
    for key in ("local_numel", "local_numel_after"):
        shares = [r[key] for r in fsdp]
        assert sum(shares) >= total and max(shares) <= total * 0.6, (shares, total)  # ~1/2 each (+ padding)


def test_two_steps_equal_ddp(runs):
    want, got = runs[False][0], runs[True][0]
    assert got["updated_step2"].keys() == want["updated_step2"].keys()
    for name, tensor in want["updated_step2"].items():
        atol = KEY_BIAS_ATOL if name.endswith("k_proj.bias") else 1e-6
        torch.testing.assert_close(got["updated_step2"][name], tensor, atol=atol, rtol=1e-5, msg=name)
    for step in ("metrics", "metrics_step2"):
        for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss"):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5, abs=1e-7), (step, key)
