"""The local-machine preflight: only a local Ray (no RAY_ADDRESS) is checked."""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from megarl.preflight.cluster import local_cluster_issues


def cfg(nnodes=1, per_node=1, device="cpu", num_cpus=None, engine_nodes=0, engines_per_node=1):
    return OmegaConf.create({"trainer": {"nnodes": nnodes, "n_gpus_per_node": per_node, "device": device},
                             "actor_rollout_ref": {"rollout": {"nnodes": engine_nodes, "n_gpus_per_node": engines_per_node}},
                             "ray_kwargs": {"ray_init": {"num_cpus": num_cpus}}})


def test_cluster_named_by_ray_address_is_not_checked(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert local_cluster_issues(cfg(nnodes=4, per_node=8, device="cuda")) == []


def test_local_cpu_slots_against_cpus(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert local_cluster_issues(cfg(per_node=4, num_cpus=2)) == []  # 4 x 0.5 CPU fits 2
    (issue,) = local_cluster_issues(cfg(per_node=5, num_cpus=2))
    assert issue.key == "trainer.n_gpus_per_node" and "5 CPU ranks reserve 2.5 CPUs" in issue.problem
    assert "<= 4" in issue.fix
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert local_cluster_issues(cfg(per_node=16)) == []  # null num_cpus = this machine's CPUs


def test_separate_async_engines_count_with_the_trainers_slots(monkeypatch):
    """separate_async's standalone pool (rollout.nnodes x n_gpus_per_node) is placed on this machine too."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert local_cluster_issues(cfg(per_node=2, num_cpus=2, engine_nodes=1, engines_per_node=2)) == []  # 4 x 0.5
    (issue,) = local_cluster_issues(cfg(per_node=2, num_cpus=2, engine_nodes=1, engines_per_node=3))
    assert issue.key == "actor_rollout_ref.rollout.n_gpus_per_node" and "5 CPU ranks reserve 2.5 CPUs" in issue.problem
    assert "set actor_rollout_ref.rollout.n_gpus_per_node <= 2" in issue.fix
    (issue,) = local_cluster_issues(cfg(per_node=4, num_cpus=2, engine_nodes=1, engines_per_node=1))
    assert issue.key == "trainer.n_gpus_per_node" and "<= 3" in issue.fix  # the trainer alone fills the machine
    (issue,) = local_cluster_issues(cfg(per_node=1, num_cpus=8, engine_nodes=2))
    assert issue.key == "actor_rollout_ref.rollout.nnodes" and "one node" in issue.problem
