"""launch/ray_cluster.sh on two nodes (two network namespaces on a veth pair, see conftest): head,
a missing node named, a worker without the cluster's token refused with the steps to fix it, worker,
submit of the demo job with trainer.nnodes=2, stop. Checks: the job ends, its workers ran on both
nodes (node ids in the log; gloo across the nodes), the checkpoint is written, nothing is left."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import REPO, demo_overrides, kill_leftovers, launch_env, pids_mentioning

pytestmark = pytest.mark.slow
SCRIPT = str(REPO / "launch" / "ray_cluster.sh")


def _run(node, nodes, args, env, timeout):
    return subprocess.run([*nodes.prefix(node), SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_two_node_ray_demo_job(nodes):
    temp = tempfile.mkdtemp(prefix="mrray", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    head_ip, worker_ip = nodes.ips
    env = launch_env(RAY_PORT="6379", RAY_TEMP_DIR=temp, CPUS_PER_NODE="2", WAIT_TIMEOUT_S="120",
                     MEGARL_DEMO_DIR=f"{temp}/demo", HOME=f"{temp}/home")  # a home with no Ray token yet
    env.pop("RAY_AUTH_TOKEN", None)
    started = time.monotonic()
    try:
        head = _run(0, nodes, ["head"], {**env, "NODE_IP": head_ip}, 240)
        assert head.returncode == 0, head.stdout + head.stderr
        assert f"copy {temp}/home/.ray/auth_token" in head.stdout, head.stdout  # the token's steps, printed
        # the head alone: `wait 2` fails within its bound and names the missing node
        waited = _run(0, nodes, ["wait", "2"], {**env, "WAIT_TIMEOUT_S": "5", "EXPECT_NODES": f"n2={worker_ip}"}, 120)
        assert waited.returncode == 3 and f"missing node(s) n2 ({worker_ip})" in waited.stderr, waited.stderr
        # a node without the cluster's token is refused at once, saying how to give it one
        tokenless = _run(1, nodes, ["worker", head_ip], {**env, "NODE_IP": worker_ip, "HOME": f"{temp}/other"}, 60)
        assert tokenless.returncode == 2 and "copy the head's ~/.ray/auth_token" in tokenless.stderr, tokenless.stderr
        token = open(f"{temp}/home/.ray/auth_token").read().strip()
        worker = _run(1, nodes, ["worker", head_ip], {**env, "NODE_IP": worker_ip, "HOME": f"{temp}/other",
                                                      "RAY_AUTH_TOKEN": token}, 240)
        assert worker.returncode == 0, worker.stdout + worker.stderr
        run_dir = f"{temp}/run"
        job = _run(0, nodes, ["submit", *demo_overrides(run_dir)],
                   {**env, "NODE_IP": head_ip, "EXPECT_NODES": f"n1={head_ip} n2={worker_ip}"}, 900)
        log = job.stdout + job.stderr
        print("\n".join(line for line in log.splitlines() if " on node " in line or "step:2" in line))
        assert job.returncode == 0, log[-6000:]
        found = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+)\)", log)
        assert len({node for _, node, _ in found}) == 2, found  # rank 0 and rank 1 on different nodes
        assert {ip for _, _, ip in found} == {head_ip, worker_ip}, found
        assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
        print(f"ray two-node demo: {time.monotonic() - started:.0f} s")
    finally:
        for node in (0, 1):
            stop = _run(node, nodes, ["stop"], env, 180)
            print(stop.stdout, stop.stderr)
        left = kill_leftovers(temp)
        assert not left, f"processes left after stop: {left}"
        assert not pids_mentioning(temp)
        shutil.rmtree(temp, ignore_errors=True)
