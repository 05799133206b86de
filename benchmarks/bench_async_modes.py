"""sync vs colocate_async vs separate_async (trainer.v1) at equal GPUs on a long-tail workload.

  python benchmarks/bench_async_modes.py --gpus 2 --model /tmp/q05 [--modes sync,colocate_async,separate_async]
  python benchmarks/bench_async_modes.py --device cpu --gpus 2 --modes sync,colocate_async,separate_async  # tiny CPU run

Each mode is one ``python -m megarl.main_ppo`` run (GRPO on the demo task's prompts) with the same
overrides: ``--batch`` prompts x ``--n`` samples a step, and the long-tail agent loop of
``tests/helpers/long_tail.py`` (``ignore_eos``: 1 in 8 prompts, by ``extra_info.index``, gets
``--response-length`` tokens, the others 1/8 of it). The async modes run one step off policy
(``--off-policy`` 2: ``max_off_policy_threshold=2``, one warm-up batch; ``--off-policy N``: N versions, N - 1
warm-up batches) with strategy ``--strategy``, default ``wait``: nothing is discarded, so every mode trains the
same prompts. GPUs are split as the mode places them:
sync and colocate_async put actor and engines on all ``--gpus`` (one replica per GPU);
separate_async trains on ``--gpus - --engines`` and generates on ``--engines`` (default half).
``--device cpu`` counts CPU slots instead (a functional check: CPU timings say nothing of GPUs).

As each mode ends, prints the table so far and writes ``--out`` (JSON; a killed later mode leaves the
earlier ones, and modes of other calls already in the file stay, so one mode a call adds up): step
seconds (median over the last whole cycles of ``--off-policy`` steps after the first ``--skip``: see
``summarize``), tokens/s/GPU (all prompt + response tokens of those steps / their seconds / GPUs, as NeMo-RL
counts; the ratio to sync is of these), samples/s, generation and update seconds, mean
staleness of the trained tokens, the ratio to sync; the run's wall seconds and the part outside its
steps (Ray and worker start, model build, vLLM start-up and compilation, shutdown: every mode is a fresh
``main_ppo``). A mode past ``--timeout`` gets SIGTERM and is summarised from the steps it finished.
Run logs: ``<--work>/<mode>/run.log`` (each line stamped with the seconds since launch); metrics:
``<--work>/<mode>/ckpt/metrics.jsonl``. A killed run's table from its metrics files (no run):

  python benchmarks/bench_async_modes.py --gpus 2 --batch 64 --n 8 --skip 2 \
      --from-metrics sync=A.jsonl colocate_async=B.jsonl separate_async=C.jsonl [--out T.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "colocate_async", "separate_async")
KILL_GRACE_S = 60  # main_ppo's Ray shutdown after SIGTERM


def overrides(args: argparse.Namespace, mode: str, run_dir: Path) -> list[str]:
    agent_yaml = run_dir / "long_tail_agent.yaml"
    agent_yaml.write_text("- name: long_tail_agent\n  _target_: helpers.long_tail.LongTailAgentLoop\n")
    engines = args.engines if args.engines is not None else max(1, args.gpus // 2)
    trainer_gpus = args.gpus - engines if mode == "separate_async" else args.gpus
    if trainer_gpus < 1:
        raise SystemExit(f"separate_async needs --gpus > --engines (got {args.gpus} GPUs, {engines} engines)")
    out = [
        f"trainer.device={args.device}", f"trainer.n_gpus_per_node={trainer_gpus}", "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}/ckpt", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={args.steps}", "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={args.batch}", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_yaml}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=long_tail_agent", "actor_rollout_ref.rollout.ignore_eos=true",
        f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"trainer.v1.sampler.max_off_policy_threshold={args.off_policy}",
        f"trainer.v1.sampler.max_off_policy_strategy={args.strategy}",
        f"trainer.v1.colocate_async.num_warmup_batches={args.off_policy - 1}",
        f"trainer.v1.separate_async.num_warmup_batches={args.off_policy - 1}",
        f"hydra.run.dir={run_dir}/hydra",
    ]
    if args.model:
        out.append(f"actor_rollout_ref.model.path={args.model}")
    if args.data:
        out += [f"data.train_files={args.data}", f"data.val_files={args.data}"]
    if args.device == "cpu":
        out.append(f"ray_kwargs.ray_init.num_cpus={args.cpus}")
    if mode == "separate_async":
        out += ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
                f"actor_rollout_ref.rollout.n_gpus_per_node={engines}",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                f"trainer.v1.separate_async.parameter_sync_step={args.batch // args.mini_batch}"]
    return out + args.extra


def run(args: argparse.Namespace, mode: str) -> dict:
    """One mode's ``main_ppo`` run under ``--timeout`` seconds, its summary. The run's output goes to
    ``run.log`` with each line stamped with the seconds since launch (where start-up and shutdown go);
    on timeout the run gets SIGTERM (main_ppo shuts Ray down), then SIGKILL after ``KILL_GRACE_S``."""
    run_dir = Path(args.work) / mode
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ckpt" / "metrics.jsonl").unlink(missing_ok=True)  # a re-run's summary reads only its own steps
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", *overrides(args, mode, run_dir)]
    (run_dir / "command.txt").write_text(" ".join(command) + "\n")
    start = time.monotonic()
    with open(run_dir / "run.log", "w") as log:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True,
                                 errors="replace")
        stamp = threading.Thread(target=_stamp_lines, args=(child.stdout, log, start), daemon=True)
        stamp.start()
        try:
            code = child.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                child.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            code = None
        stamp.join(timeout=10)
    wall_s = time.monotonic() - start
    steps = read_steps(run_dir / "ckpt" / "metrics.jsonl")
    if code != 0:
        tail = (run_dir / "run.log").read_text(errors="replace")[-3000:]
        why = f"timed out after {args.timeout:.0f} s" if code is None else f"failed (exit {code})"
        print(f"{mode} {why} after {len(steps)} of {args.steps} steps; {run_dir}/run.log ends:\n{tail}", flush=True)
        if len(steps) <= args.skip:
            return {"mode": mode, "error": why, "steps_done": len(steps), "wall_s": round(wall_s, 1)}
    result = summarize(mode, steps, args)
    result.update(wall_s=round(wall_s, 1), outside_steps_s=round(wall_s - sum(m["timing_s/step"] for m in steps), 1))
    if code != 0:
        result["error"] = why
    return result


def _stamp_lines(stream, log, start: float) -> None:
    for line in stream:
        log.write(f"[{time.monotonic() - start:7.1f}s] {line}")
        log.flush()


def read_steps(path: Path) -> list[dict]:
    """The run's per-step metrics (one JSON object a line; none if the run wrote none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def summarize(mode: str, steps: list[dict], args: argparse.Namespace) -> dict:
    """One mode's figures from its per-step metrics over the window: the last whole cycles of ``--off-policy``
    steps after ``--skip`` (all of them if less than a cycle; all steps if none is after it). With threshold T
    an async mode's phase generates for up to T steps and the next ones little, so a window of whole cycles
    holds as many of those long steps as the mode's pace has. Throughput over the window; medians of the
    phases (means for lag and length). Every mode takes the same steps, so the same tokens."""
    after = [m for m in steps if m["step"] > args.skip]
    whole = len(after) // args.off_policy * args.off_policy
    timed = after[len(after) - whole:] if whole else after or steps
    seconds = sum(m["timing_s/step"] for m in timed)
    return {
        "mode": mode, "steps_done": len(steps), "steps_timed": len(timed),
        "step_s": round(statistics.median(m["timing_s/step"] for m in timed), 3),
        # throughput over the window, not a median step, which misreads the cycles
        "tokens_per_s_per_gpu": round(sum(m["perf/total_num_tokens"] for m in timed) / seconds / args.gpus, 1),
        "samples_per_s": round(args.batch * args.n * len(timed) / seconds, 2),
        "gen_s": round(statistics.median(m.get("timing_s/gen", 0.0) for m in timed), 3),
        # the engines' own time in it: the replicas' mean and the slowest (colocated modes; 0 where not reported)
        "engine_s": round(statistics.median(m.get("timing_s/gen_engine", 0.0) for m in timed), 3),
        "engine_max_s": round(statistics.median(m.get("timing_s/gen_engine_max", 0.0) for m in timed), 3),
        "update_actor_s": round(statistics.median(m.get("timing_s/update_actor", 0.0) for m in timed), 3),
        "policy_lag_mean": round(statistics.mean(m["training/off_policy/policy_lag_mean"] for m in timed), 3),
        "response_length_mean": round(statistics.mean(m["response_length/mean"] for m in timed), 1),
        "first_step_s": round(steps[0]["timing_s/step"], 1),
    }


HEADER = (f"{'mode':16} {'step s':>8} {'tok/s/GPU':>10} {'samples/s':>10} {'gen s':>7} {'engine s':>8} {'max':>6} "
          f"{'upd s':>7} {'lag':>5} "
          f"{'vs sync':>8} {'wall s':>7} {'outside steps s':>15}")


def row(r: dict, base: dict | None) -> str:
    if "step_s" not in r:
        return f"{r['mode']:16} {r['error']} after {r['steps_done']} steps"
    ratio = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"] if base else float("nan")
    r["tokens_per_s_per_gpu_vs_sync"] = round(ratio, 3)
    return (f"{r['mode']:16} {r['step_s']:8.3f} {r['tokens_per_s_per_gpu']:10.1f} {r['samples_per_s']:10.2f} "
            f"{r['gen_s']:7.3f} {r.get('engine_s', 0.0):8.3f} {r.get('engine_max_s', 0.0):6.3f} "
            f"{r['update_actor_s']:7.3f} {r['policy_lag_mean']:5.2f} {ratio:8.2f} "
            f"{r.get('wall_s', float('nan')):7.1f} {r.get('outside_steps_s', float('nan')):15.1f}"
            + (f"  ({r['error']}, {r['steps_done']} steps)" if "error" in r else ""))


def report(args: argparse.Namespace, results: list[dict]) -> None:
    """The table so far (flushed) and ``--out``: this run's modes replace the same modes of an earlier
    run in the file (the steps of a split run, one mode a call, add up into one file)."""
    done = {r["mode"]: r for r in results}
    if args.out and Path(args.out).is_file():
        earlier = [r for r in json.loads(Path(args.out).read_text())["results"] if r["mode"] not in done]
        results = earlier + results
    base = next((r for r in results if r["mode"] == "sync" and "step_s" in r), None)
    print(HEADER)
    for r in results:
        print(row(r, base))
    sys.stdout.flush()
    if args.out:
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
        tmp.replace(args.out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (CPU slots with --device cpu) every mode uses")
    parser.add_argument("--engines", type=int, default=None, help="separate_async: GPUs of the rollout pool (default gpus // 2)")
    parser.add_argument("--modes", default="sync,colocate_async", help=f"comma-separated, of {MODES}")
    parser.add_argument("--model", default=None, help="HF model dir (default: the embedded demo model)")
    parser.add_argument("--data", default=None, help="parquet with extra_info.index (default: the demo's)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--mini-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4, help="actor.ppo_micro_batch_size_per_gpu (responses)")
    parser.add_argument("--response-length", type=int, default=1024, help="the long responses' length")
    parser.add_argument("--strategy", default="wait", choices=("wait", "drop"))
    parser.add_argument("--off-policy", type=int, default=2,
                        help="async modes: the most policy versions a sample spans (warm-up batches: one less)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="steps left out of the window (start-up)")
    parser.add_argument("--cpus", type=int, default=2, help="--device cpu: Ray's CPUs")
    parser.add_argument("--work", default="/tmp/bench_async_modes")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a mode's run may take (then SIGTERM)")
    parser.add_argument("--from-metrics", nargs="+", metavar="MODE=METRICS_JSONL", default=None,
                        help="summarize earlier runs' metrics.jsonl files (same --gpus/--batch/--n/--skip) instead of running")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_intermixed_args()  # options and key=value overrides in any order
    if args.from_metrics:
        report(args, [summarize(mode, read_steps(Path(path)), args)
                      for mode, path in (item.split("=", 1) for item in args.from_metrics)])
        return
    results = []
    for mode in args.modes.split(","):
        results.append(run(args, mode))
        report(args, results)  # each mode on disk as soon as it is done: a killed later mode leaves it
        if "step_s" not in results[-1]:
            raise SystemExit(f"{mode}: {results[-1]['error']}")

if __name__ == "__main__":
    main()
