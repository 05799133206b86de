"""gloo across two machines (issue 37 item 10): ranks in two network namespaces joined by a veth pair,
where the host name resolves to loopback. megarl.parallel.init_distributed binds gloo to the interface
that reaches MASTER_ADDR, so the ranks find each other; a GLOO_SOCKET_IFNAME the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.netns import netns_available, two_nodes

RANK = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from megarl.parallel import init_distributed

    init_distributed({}, "cpu", seed=0)
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print("IFNAME", os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME"), "SUM", t.tolist(), flush=True)
""")


@pytest.mark.slow
def test_gloo_ranks_in_two_network_namespaces_meet():
    why = netns_available()
    if why:
        pytest.skip(why)
    with two_nodes("gl") as nodes:
        env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": nodes.ips[0], "MASTER_PORT": "29731",
               "OMP_NUM_THREADS": "1"}
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.pop(var, None)
        ranks = [subprocess.Popen([*nodes.prefix(r), sys.executable, "-c", RANK], env={**env, "RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        outs = []
        for proc in ranks:
            try:
                outs.append(proc.communicate(timeout=180)[0])
            except subprocess.TimeoutExpired:
                for p in ranks:
                    p.kill()
                raise
    for rank, (proc, out) in enumerate(zip(ranks, outs)):
        assert proc.returncode == 0, f"rank {rank}:\n{out[-3000:]}"
        line = next(line for line in out.splitlines() if line.startswith("IFNAME"))
        veth = f"{nodes.names[0][:-1]}{'xy'[rank]}"  # this rank's end of the pair
        assert line == f"IFNAME {veth} {veth} SUM [3.0, 3.0]", line


def test_an_interface_the_user_set_is_kept(monkeypatch):
    from megarl.parallel.net_iface import interface_towards, use_route_to_master

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert use_route_to_master() == ["NCCL_SOCKET_IFNAME"]
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7" and os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    assert interface_towards("127.0.0.1") == "lo"
