"""Two-node launch tests: heavy (several minutes on 2 cores), so they run only with
MEGARL_LAUNCH_TESTS=1 (and are marked slow). Each test's two nodes are two network namespaces
joined by a veth pair (helpers.netns: like two machines, loopback does not reach the other node).
Shared helpers: the nodes, env, process cleanup."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from helpers.netns import netns_available, two_nodes

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MEGARL_LAUNCH_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="two-node launch test: set MEGARL_LAUNCH_TESTS=1 to run it")
    for item in items:
        if "tests/launch/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture
def nodes():
    """Two nodes: network namespaces on a veth pair (``nodes.prefix(i)`` runs a command on node i)."""
    why = netns_available()
    if why:
        pytest.skip(why)
    with two_nodes("ln") as pair:
        yield pair


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launch_env(**extra: str) -> dict[str, str]:
    """This interpreter's bin dir first on PATH (ray, torchrun), the repo on PYTHONPATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}".rstrip(":")
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (a temp dir unique to this test)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(int(proc.name))
    return found


def kill_leftovers(text: str, grace_s: float = 5.0) -> list[int]:
    """SIGKILL, by pid, each process still mentioning ``text``; returns those found."""
    left = pids_mentioning(text)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(grace_s if left else 0)
    return left


def demo_overrides(run_dir: str) -> list[str]:
    """The CPU demo on 2 nodes x 1 slot, 2 steps, a checkpoint at step 2 (DP=2 halves the
    per-rank mini-batch: 8 prompts x 16 / 2 = 64 responses, so the micro-batch is 64)."""
    return ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.total_training_steps=2",
            "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64", f"trainer.default_local_dir={run_dir}"]
