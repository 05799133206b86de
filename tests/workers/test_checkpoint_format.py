"""The distributed optimizer's checkpoint format (megatron's ``distrib_optim_sharding_type``) follows
verl's keys, and a state this run cannot read is refused up front naming the keys.

verl 0.9.1 (``MegatronCheckpointManager._build_sharded_state_dict_metadata``): distributed optimizer ->
``dp_reshardable``, or ``fully_reshardable`` with ``megatron.dist_ckpt_optim_fully_reshardable``;
megatron-core's default when no metadata is passed (``fully_sharded_model_space``, 0.16.1 and 0.19.2) cannot
save a parameter split over DP ranks ("ShardedTensor.flattened_range is not supported").
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megarl.config import load_config, resolve_config
from megarl.workers.megatron import checkpoint


def _engine(dist_opt: bool, fully: bool = False, mem_efficient: bool = False):
    cfg = SimpleNamespace(use_megatron_fsdp=False, dist_ckpt_optim_fully_reshardable=fully,
                          distrib_optim_fully_reshardable_mem_efficient=mem_efficient)
    return SimpleNamespace(use_distributed_optimizer=dist_opt, megatron_cfg=cfg)


def test_format_follows_verls_keys():
    assert checkpoint.optimizer_format(_engine(False, fully=True)) == "torch"
    assert checkpoint.optimizer_format(_engine(True)) == "dp_reshardable"
    assert checkpoint.optimizer_format(_engine(True, fully=True)) == "fully_reshardable"
    assert checkpoint._optimizer_metadata(_engine(True, fully=True, mem_efficient=True), "fully_reshardable") == {
        "distrib_optim_sharding_type": "fully_reshardable", "distrib_optim_fully_reshardable_mem_efficient": True}
    assert checkpoint._optimizer_metadata(_engine(False), "torch") is None


def test_keys_are_typed_for_actor_and_critic():
    cfg = resolve_config(load_config([
        "actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable=true",
        "critic.megatron.distrib_optim_fully_reshardable_mem_efficient=true"]))
    assert cfg.actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable is True
    assert cfg.critic.megatron.distrib_optim_fully_reshardable_mem_efficient is True
    assert cfg.critic.megatron.dist_ckpt_optim_fully_reshardable is False  # verl's default


def test_unreadable_optimizer_state_is_refused_naming_the_keys(monkeypatch):
    monkeypatch.setattr(checkpoint, "_layout", lambda: {"tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1})
    same = {"tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1}
    other = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1}
    checkpoint._check_optimizer_format(_engine(True), "dp_reshardable", same, "/ckpt")  # same layout: fine
    checkpoint._check_optimizer_format(_engine(True), "fully_reshardable", other, "/ckpt")  # any layout
    with pytest.raises(ValueError, match="dist_ckpt_optim_fully_reshardable.*load_contents"):
        checkpoint._check_optimizer_format(_engine(True), "dp_reshardable", other, "/ckpt")
    with pytest.raises(ValueError, match="use_distributed_optimizer=false"):
        checkpoint._check_optimizer_format(_engine(False), "dp_reshardable", same, "/ckpt")
    with pytest.raises(ValueError, match="without the distributed optimizer"):
        checkpoint._check_optimizer_format(_engine(True), "torch", same, "/ckpt")
