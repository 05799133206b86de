"""`actor_rollout_ref.nccl_timeout` / `critic.nccl_timeout` (seconds) reach torch.distributed's
init_process_group as the group's timeout, and megatron's model-parallel groups (whole minutes),
as verl's workers pass it."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from megatron.core import parallel_state

import megarl.parallel.net_iface as net_iface
from helpers.tiny import megatron_node, project_config


class _Stop(Exception):
    pass


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_nccl_timeout_is_the_process_group_timeout(role, monkeypatch, tmp_path):
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker

    key = "actor_rollout_ref.nccl_timeout" if role == "actor" else "critic.nccl_timeout"
    cfg = project_config(str(tmp_path), {key: 4321}, megatron_node(), ())
    worker = (ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu") if role == "actor"
              else CriticWorker(cfg.critic, device="cpu"))
    seen = {}

    def init_process_group(**kwargs):
        seen["group"] = kwargs

    def initialize_model_parallel(**kwargs):
        seen["model_parallel"] = kwargs
        raise _Stop  # what was asked of torch.distributed and megatron is all this test needs

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 1)
    monkeypatch.setattr(net_iface, "use_route_to_master", lambda: None)
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: False)
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", initialize_model_parallel)
    with pytest.raises(_Stop):
        worker.engine.init_model()
    assert seen["group"]["timeout"] == datetime.timedelta(seconds=4321)
    assert seen["model_parallel"]["distributed_timeout_minutes"] == 73  # 4321 s, rounded up to minutes
