"""One fault run of issue 37 item 8: a `main_ppo` run in which one rank stalls at a named point
(megarl/utils/fault_points.py) and is then killed (`--kill`) or left stalled (the collective timeout,
`nccl_timeout`, must end the run). Prints what a user sees and what is left behind:

  python benchmarks/fault_run.py --name kill_update --pause update_microbatch@2:rank1 --kill --limit 420 -- OVERRIDES...
  python benchmarks/fault_run.py --name nccl_timeout --pause update_microbatch@2:rank1 --limit 420 -- \
      actor_rollout_ref.nccl_timeout=60 OVERRIDES...

Output (stdout, and the run's log in $OUT/NAME.log): the driver's exit code, seconds from the pause
(or the kill) to the driver's exit, the driver's failure report, and the processes left: Ray's and, on
a GPU machine, every process still holding GPU memory. A driver still running at --limit is reported
as HUNG and killed with everything it started.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

PAUSED = re.compile(r"\[megarl\] rank (\d+) \(pid (\d+)\) paused at (\S+ \d+)")


def left_behind() -> list[str]:
    """Ray processes (pid, state, command) and GPU compute processes still alive (one line each)."""
    table = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout  # stat: D, Z, ...
    lines = [f"process: {line.strip()[:240]}" for line in table.splitlines()
             if re.search(r"raylet|gcs_server|ray::", line) and " ps -eo" not in line]
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        lines += [f"on a GPU: {line}" for line in gpu.splitlines() if line.strip()]
    except FileNotFoundError:
        pass
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--pause", required=True, help="MEGARL_PAUSE_AT, <point>@<n>:rank<r>")
    parser.add_argument("--kill", action="store_true", help="kill -9 the paused rank (else leave it stalled)")
    parser.add_argument("--limit", type=float, default=420, help="seconds for the whole run")
    parser.add_argument("--grace", type=float, default=90, help="seconds to wait for its processes after the driver's exit")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "outputs"))
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"{args.name}.log"
    command = [sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", *args.overrides]
    start = time.monotonic()
    with open(log_path, "w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "MEGARL_PAUSE_AT": args.pause})
    paused_at = None
    while driver.poll() is None and time.monotonic() - start < args.limit:
        match = PAUSED.search(log_path.read_text(errors="replace"))
        if match and paused_at is None:
            paused_at = time.monotonic()
            rank, pid = int(match.group(1)), int(match.group(2))
            print(f"{args.name}: rank {rank} (pid {pid}) paused at {match.group(3)} after {paused_at - start:.0f} s")
            if args.kill:
                os.kill(pid, signal.SIGKILL)
                print(f"{args.name}: killed pid {pid}")
        time.sleep(0.5)
    hung = driver.poll() is None
    if hung:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    text = log_path.read_text(errors="replace")
    report = text[text.find("megarl: the run failed"):] if "megarl: the run failed" in text else text[-3000:]
    since = f"{time.monotonic() - paused_at:.0f} s after the {'kill' if args.kill else 'pause'}" if paused_at else "never paused"
    print(f"{args.name}: {'HUNG (killed at the limit)' if hung else f'exit {driver.returncode}'}, {since}, "
          f"{time.monotonic() - start:.0f} s in all")
    print(report.strip()[:4000])
    # The CPU fault tests give the driver's processes 30 s to go (tests/fault/fault_driver.py); here the time
    # they take is the figure: a rank killed mid-collective on a GPU holds its memory until its context is torn down.
    exited = time.monotonic()
    leftovers = left_behind()
    while leftovers and time.monotonic() - exited < args.grace:
        before = len(leftovers)
        time.sleep(1)
        leftovers = left_behind()
        if len(leftovers) != before:
            print(f"{args.name}: {len(leftovers)} left {time.monotonic() - exited:.0f} s after the driver's exit")
    print(f"{args.name}: left behind {time.monotonic() - exited:.0f} s after the driver's exit: {len(leftovers)}")
    print("\n".join(leftovers))
    return 0 if paused_at and not hung and driver.returncode != 0 else 1


if __name__ == "__main__":
    sys.exit(main())
