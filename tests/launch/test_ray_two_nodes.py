"""launch/ray_cluster.sh on two Ray nodes of this machine (the host's address and 127.0.0.2):
head, worker, submit of the demo job with trainer.nnodes=2, stop. Checks: the job ends, its
workers ran on both nodes (node ids in the log), the checkpoint is written, nothing is left."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import REPO, demo_overrides, free_port, kill_leftovers, launch_env, pids_mentioning

pytestmark = pytest.mark.slow
SCRIPT = str(REPO / "launch" / "ray_cluster.sh")


def _run(args, env, timeout):
    return subprocess.run([SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_two_node_ray_demo_job():
    temp = tempfile.mkdtemp(prefix="mrray", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    port = free_port()
    env = launch_env(RAY_PORT=str(port), RAY_TEMP_DIR=temp, CPUS_PER_NODE="2", WAIT_TIMEOUT_S="120",
                     MEGARL_DEMO_DIR=f"{temp}/demo")
    started = time.monotonic()
    try:
        head = _run(["head"], {**env, "RAY_NODE_ARGS": f"--ray-client-server-port={free_port()} "
                                                       f"--dashboard-agent-listen-port={free_port()}"}, 240)
        assert head.returncode == 0, head.stdout + head.stderr
        # the head alone: `wait 2` fails within its bound and names the missing node
        waited = _run(["wait", "2", "127.0.0.2"], {**env, "WAIT_TIMEOUT_S": "5"}, 120)
        assert waited.returncode == 3 and "missing node(s) ['127.0.0.2']" in waited.stderr, waited.stderr
        worker = _run(["worker", "127.0.0.1"], {**env, "NODE_IP": "127.0.0.2",
                                                "RAY_NODE_ARGS": f"--dashboard-agent-listen-port={free_port()}"}, 240)
        assert worker.returncode == 0, worker.stdout + worker.stderr
        run_dir = f"{temp}/run"
        job = _run(["submit", *demo_overrides(run_dir)], env, 900)
        log = job.stdout + job.stderr
        print("\n".join(line for line in log.splitlines() if " on node " in line or "step:2" in line))
        assert job.returncode == 0, log[-6000:]
        nodes = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+)\)", log)
        assert len({node for _, node, _ in nodes}) == 2, nodes  # rank 0 and rank 1 on different nodes
        assert "127.0.0.2" in {ip for _, _, ip in nodes}
        assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
        print(f"ray two-node demo: {time.monotonic() - started:.0f} s")
    finally:
        stop = _run(["stop"], env, 180)
        print(stop.stdout, stop.stderr)
        left = kill_leftovers(temp)
        assert not left, f"processes left after stop: {left}"
        assert not pids_mentioning(temp)
        shutil.rmtree(temp, ignore_errors=True)
