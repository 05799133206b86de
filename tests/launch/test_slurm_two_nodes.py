"""launch/slurm_megarl.sbatch on a local two-node Slurm cluster (launch/local_slurm/up.sh:
slurmctld + `slurmd -N n1` / `-N n2`): `sbatch --nodes=2` runs the demo job to completion
over both nodes; then a longer job is cancelled (scancel = SIGTERM) after its first
checkpoint (SIGTERM to the batch script and its children, as Slurm does before a time limit):
every published checkpoint verifies, and no process is left behind."""

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

from conftest import REPO, demo_overrides, free_port, kill_leftovers, launch_env, pids_mentioning

pytestmark = pytest.mark.slow
UP, DOWN = str(REPO / "launch" / "local_slurm" / "up.sh"), str(REPO / "launch" / "local_slurm" / "down.sh")
SBATCH = str(REPO / "launch" / "slurm_megarl.sbatch")


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("slurmctld") or not shutil.which("munged"):
        pytest.skip("needs slurm-wlm and munge (apt-get install slurm-wlm munge)")
    base = tempfile.mkdtemp(prefix="mrsl", dir="/tmp")
    env = launch_env(LOCAL_SLURM_DIR=f"{base}/slurm", SLURM_BASE_PORT=str(random.randrange(30000, 39000)),
                     SLURM_CONF=f"{base}/slurm/slurm.conf")
    up = subprocess.run([UP], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield base, env
    finally:
        subprocess.run([DOWN], env=env, capture_output=True, text=True, timeout=180)
        left = kill_leftovers(base)
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes left after down.sh: {left}"


def _job_env(base: str, env: dict, name: str) -> dict:
    return {**env, "RAY_PORT": str(free_port()), "RAY_TEMP_DIR": f"{base}/{name}", "RAY_AGENT_PORT_BASE": str(free_port()),
            "RAY_HEAD_ARGS": f"--ray-client-server-port={free_port()}", "WAIT_TIMEOUT_S": "180",
            "MEGARL_DEMO_DIR": f"{base}/demo"}


def _sbatch(env: dict, out: str, overrides: list[str], wait: bool) -> subprocess.CompletedProcess:
    args = ["sbatch", "--nodes=2", "--parsable", f"--output={out}", *(["--wait"] if wait else []), SBATCH, *overrides]
    return subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200 if wait else 60)


def test_sbatch_two_nodes_runs_the_demo(cluster):
    base, env = cluster
    started = time.monotonic()
    run_dir, out = f"{base}/run", f"{base}/job.out"
    job_env = _job_env(base, env, "ray1")
    done = _sbatch(job_env, out, [o for o in demo_overrides(run_dir) if not o.startswith("trainer.nnodes")], wait=True)
    log = Path(out).read_text() if Path(out).exists() else ""
    assert done.returncode == 0, done.stderr + log[-6000:]
    print("\n".join(line for line in log.splitlines() if " on node " in line or line.startswith("megarl:")))
    nodes = re.findall(r"worker group actor_rollout_ref: ranks \[(\d+)\] on node (\w+) \(([\d.]+)\)", log)
    assert len({node for _, node, _ in nodes}) == 2 and "127.0.0.2" in {ip for _, _, ip in nodes}, nodes
    assert "trainer exited with 0" in log and "Ray nodes stopped" in log
    assert os.path.isdir(f"{run_dir}/global_step_2"), os.listdir(run_dir)
    assert not kill_leftovers(job_env["RAY_TEMP_DIR"]), "Ray processes left after the job"
    print(f"slurm two-node demo: {time.monotonic() - started:.0f} s")


def test_scancel_stops_everything_and_leaves_only_whole_checkpoints(cluster):
    from megarl.trainer.checkpointing import verify_checkpoint

    base, env = cluster
    started = time.monotonic()
    run_dir, out = f"{base}/run_cancel", f"{base}/cancel.out"
    job_env = _job_env(base, env, "ray2")
    overrides = [o for o in demo_overrides(run_dir) if not o.startswith(("trainer.nnodes", "trainer.total_training_steps",
                                                                         "trainer.save_freq"))]
    sub = _sbatch(job_env, out, [*overrides, "trainer.total_training_steps=50", "trainer.save_freq=1"], wait=False)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 900
    while not os.path.isdir(f"{run_dir}/global_step_1"):
        assert time.monotonic() < deadline, Path(out).read_text()[-4000:]
        time.sleep(2)
    # SIGTERM to the batch shell and everything under it, as at the time limit (--signal=B:TERM@120)
    subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 180
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "the job did not end within 180 s of scancel"
        time.sleep(2)
    time.sleep(3)
    log = Path(out).read_text()
    print(log[-1500:])
    assert "SIGTERM" in log and "Ray nodes stopped" in log
    steps = sorted(p for p in Path(run_dir).iterdir() if re.fullmatch(r"global_step_\d+", p.name))
    assert steps
    for step in steps:  # every published step is whole (an interrupted save stays a .saving dir)
        verify_checkpoint(step, ["actor"])
    assert not pids_mentioning(job_env["RAY_TEMP_DIR"]), "Ray processes left after scancel"
    assert not pids_mentioning(run_dir), "trainer processes left after scancel"
    print(f"slurm scancel: {time.monotonic() - started:.0f} s, published steps {[p.name for p in steps]}")
