"""launch/torchrun_multinode.sh with NNODES=2: two launchers on this machine (node 1 as
127.0.0.2), rendezvous on a local address; node 0 runs the demo job over both Ray nodes."""

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
SCRIPT = str(REPO / "launch" / "torchrun_multinode.sh")


def test_two_node_torchrun_demo_job():
    temp = tempfile.mkdtemp(prefix="mrtr", dir="/tmp")
    run_dir = f"{temp}/run"
    env = launch_env(NNODES="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RAY_PORT=str(free_port()),
                     RAY_TEMP_DIR=temp, CPUS_PER_NODE="2", WAIT_TIMEOUT_S="180", MEGARL_DEMO_DIR=f"{temp}/demo")
    node_env = [
        {**env, "NODE_RANK": "0",
         "RAY_NODE_ARGS": f"--ray-client-server-port={free_port()} --dashboard-agent-listen-port={free_port()}"},
        {**env, "NODE_RANK": "1", "NODE_IP": "127.0.0.2", "RAY_NODE_ARGS": f"--dashboard-agent-listen-port={free_port()}"},
    ]
    started = time.monotonic()
    overrides = [o for o in demo_overrides(run_dir) if not o.startswith("trainer.nnodes=")]
    procs = [subprocess.Popen([SCRIPT, *overrides], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for e in node_env]
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for rank, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"node {rank}:\n{out[-6000:]}"
        nodes = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+)\)", outs[0])
        print("\n".join(line for line in outs[0].splitlines() if " on node " in line))
        assert len({node for _, node, _ in nodes}) == 2 and "127.0.0.2" in {ip for _, _, ip in nodes}, nodes
        assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
        assert "stopped worker-127.0.0.2" in outs[1] and "stopped head" in outs[0]
        print(f"torchrun two-node demo: {time.monotonic() - started:.0f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        left = kill_leftovers(temp)
        assert not left, f"processes left: {left}"
        assert not pids_mentioning(temp)
        shutil.rmtree(temp, ignore_errors=True)
