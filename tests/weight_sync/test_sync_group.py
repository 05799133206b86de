"""The weight-push group (megarl.weight_sync.sync_group): a bucketed, checksummed broadcast between
processes that each hold their own torch.distributed world (the trainer's rank 0 and the standalone
engines of trainer.v1 separate_async), gloo on CPU."""

from __future__ import annotations

import pytest

from helpers.dist_utils import run_distributed
from sync_group_body import push_across_worlds

pytestmark = pytest.mark.slow


def test_push_reaches_every_engine_outside_their_worlds(tmp_path):
    results = run_distributed(push_across_worlds, 3, str(tmp_path), True)
    assert all(r["own_world"] == 1 for r in results)  # the group lives beside each process's own world
    assert results[0]["equal"] and results[1]["equal"] and results[1]["buckets"] > 2
    assert results[2]["error_bucket"] == 1  # the damaged bucket is named; the others kept in step


def test_without_the_check_the_damage_goes_through(tmp_path):
    results = run_distributed(push_across_worlds, 3, str(tmp_path), False)
    assert results[1]["equal"] and not results[2]["equal"]
