"""launch/slurm_megarl.sbatch on a local two-node Slurm cluster (launch/local_slurm/up.sh: slurmctld
and `slurmd -N n1` in one network namespace, `slurmd -N n2` in another, joined by a veth pair, see
conftest): `sbatch --nodes=2`, from a directory outside the repository and with a home that holds no
Ray token, runs the demo job to completion over both nodes; then a longer job is stopped by a plain
`scancel` after its first checkpoint: the trainer stops itself (exit 143, one line), every published
checkpoint verifies, and no process is left behind."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, demo_overrides, kill_leftovers, launch_env, pids_mentioning
from helpers.netns import netns_available, two_nodes

pytestmark = pytest.mark.slow
UP, DOWN = str(REPO / "launch" / "local_slurm" / "up.sh"), str(REPO / "launch" / "local_slurm" / "down.sh")
SBATCH = str(REPO / "launch" / "slurm_megarl.sbatch")


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("slurmctld") or not shutil.which("munged"):
        pytest.skip("needs slurm-wlm and munge (apt-get install slurm-wlm munge)")
    why = netns_available()
    if why:
        pytest.skip(why)
    base = tempfile.mkdtemp(prefix="mrsl", dir="/tmp")
    with two_nodes("sl") as nodes:
        env = launch_env(LOCAL_SLURM_DIR=f"{base}/slurm", SLURM_BASE_PORT=str(random.randrange(30000, 39000)),
                         SLURM_CONF=f"{base}/slurm/slurm.conf", NODE_ADDRS=" ".join(nodes.ips),
                         NODE_NETNS=" ".join(nodes.names))
        up = subprocess.run([UP], env=env, capture_output=True, text=True, timeout=120)
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            yield base, env, nodes
        finally:
            subprocess.run([DOWN], env=env, capture_output=True, text=True, timeout=180)
            left = kill_leftovers(base)
            shutil.rmtree(base, ignore_errors=True)
            assert not left, f"processes left after down.sh: {left}"


def _job_env(base: str, env: dict, name: str) -> dict:
    home = Path(base) / f"home_{name}"  # no ~/.ray/auth_token: the job makes its own token
    home.mkdir()
    job = {**env, "RAY_PORT": "6379", "RAY_TEMP_DIR": f"{base}/{name}", "WAIT_TIMEOUT_S": "180",
           "MEGARL_DEMO_DIR": f"{base}/demo", "HOME": str(home)}
    job.pop("RAY_AUTH_TOKEN", None)
    return job


def _slurm(nodes, *args: str, env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """A Slurm client command, on node n1 (slurmctld's namespace)."""
    return subprocess.run([*nodes.prefix(0), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _sbatch(nodes, env: dict, cwd: str, out: str, overrides: list[str], wait: bool) -> subprocess.CompletedProcess:
    return _slurm(nodes, "sbatch", "--nodes=2", "--parsable", f"--output={out}", *(["--wait"] if wait else []), SBATCH,
                  *overrides, env=env, cwd=cwd, timeout=1200 if wait else 60)


def test_sbatch_two_nodes_runs_the_demo(cluster):
    base, env, nodes = cluster
    started = time.monotonic()
    run_dir, out = f"{base}/run", f"{base}/job.out"
    job_env = _job_env(base, env, "ray1")
    elsewhere = tempfile.mkdtemp(dir=base)  # not the repository: launch/ is found without it
    done = _sbatch(nodes, job_env, elsewhere, out, [o for o in demo_overrides(run_dir) if not o.startswith("trainer.nnodes")],
                   wait=True)
    log = Path(out).read_text() if Path(out).exists() else ""
    assert done.returncode == 0, done.stderr + log[-6000:]
    print("\n".join(line for line in log.splitlines() if " on node " in line or line.startswith("megarl:")))
    found = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+), Slurm node (\w+)\)", log)
    assert {(ip, name) for _, _, ip, name in found} == {(nodes.ips[0], "n1"), (nodes.ips[1], "n2")}, found
    assert "trainer exited with 0" in log and "Ray nodes stopped" in log
    assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
    assert not kill_leftovers(job_env["RAY_TEMP_DIR"]), "Ray processes left after the job"
    print(f"slurm two-node demo: {time.monotonic() - started:.0f} s")


def test_plain_scancel_stops_everything_and_leaves_only_whole_checkpoints(cluster):
    from megarl.trainer.checkpointing import verify_checkpoint

    base, env, nodes = cluster
    started = time.monotonic()
    run_dir, out = f"{base}/run_cancel", f"{base}/cancel.out"
    job_env = _job_env(base, env, "ray2")
    overrides = [o for o in demo_overrides(run_dir) if not o.startswith(("trainer.nnodes", "trainer.total_training_steps",
                                                                         "trainer.save_freq"))]
    sub = _sbatch(nodes, job_env, str(REPO), out, [*overrides, "trainer.total_training_steps=50", "trainer.save_freq=1"],
                  wait=False)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 900
    while not os.path.isdir(f"{run_dir}/global_step_1"):
        assert time.monotonic() < deadline, Path(out).read_text()[-4000:]
        time.sleep(2)
    cancelled = time.monotonic()
    _slurm(nodes, "scancel", job, env=env, cwd=base, timeout=30)  # what a user types: SIGTERM to every step
    deadline = time.monotonic() + 180
    while _slurm(nodes, "squeue", "-h", "-j", job, env=env, cwd=base, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, "the job did not end within 180 s of scancel"
        time.sleep(2)
    time.sleep(3)
    log = Path(out).read_text()
    ours = "\n".join(line for line in log.splitlines() if "pid=" not in line)  # not the workers' forwarded lines
    print(ours[-3000:])
    assert re.search(r"megarl: stopped by SIGTERM in phase \w+ at global step \d+ \(exit code 143\)", log), ours[-4000:]
    assert "SIGTERM received at time" not in log, ours[-4000:]  # Ray's native handler no longer aborts the trainer
    steps = sorted(p for p in Path(run_dir).iterdir() if re.fullmatch(r"global_step_\d+", p.name))
    assert steps
    for step in steps:  # every published step is whole (an interrupted save stays a .saving dir)
        verify_checkpoint(step, ["actor"])
    assert not pids_mentioning(job_env["RAY_TEMP_DIR"]), "Ray processes left after scancel"
    assert not pids_mentioning(run_dir), "trainer processes left after scancel"
    print(f"slurm scancel: ended {time.monotonic() - cancelled:.0f} s after scancel, {time.monotonic() - started:.0f} s in all, "
          f"published steps {[p.name for p in steps]}")
