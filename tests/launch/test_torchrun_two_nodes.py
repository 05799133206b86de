"""launch/torchrun_multinode.sh with NNODES=2: two launchers, one on each node (two network namespaces
on a veth pair, see conftest), rendezvous at node 0's address; node 0 runs the demo job over both Ray
nodes (torchrun's own gloo group and the trainer's ranks both cross the pair)."""

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


def test_two_node_torchrun_demo_job(nodes):
    temp = tempfile.mkdtemp(prefix="mrtr", dir="/tmp")
    run_dir = f"{temp}/run"
    env = launch_env(NNODES="2", MASTER_ADDR=nodes.ips[0], MASTER_PORT=str(free_port()), RAY_PORT="6379",
                     RAY_TEMP_DIR=temp, CPUS_PER_NODE="2", WAIT_TIMEOUT_S="180", MEGARL_DEMO_DIR=f"{temp}/demo")
    started = time.monotonic()
    overrides = [o for o in demo_overrides(run_dir) if not o.startswith("trainer.nnodes=")]
    procs = [subprocess.Popen([*nodes.prefix(rank), SCRIPT, *overrides],
                              env={**env, "NODE_RANK": str(rank), "NODE_IP": nodes.ips[rank]},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for rank, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, f"node {rank}:\n{out[-6000:]}"
        found = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+)\)", outs[0])
        print("\n".join(line for line in outs[0].splitlines() if " on node " in line))
        assert len({node for _, node, _ in found}) == 2 and {ip for _, _, ip in found} == set(nodes.ips), found
        assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
        assert f"stopped worker-{nodes.ips[1]}" in outs[1] and "stopped head" in outs[0]
        print(f"torchrun two-node demo: {time.monotonic() - started:.0f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        left = kill_leftovers(temp)
        assert not left, f"processes left: {left}"
        assert not pids_mentioning(temp)
        shutil.rmtree(temp, ignore_errors=True)
