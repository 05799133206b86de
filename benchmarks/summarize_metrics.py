"""One table per run from a megarl ``metrics.jsonl``: phases, memory, weight sync, tokens/s/GPU.

  python benchmarks/summarize_metrics.py RUN_DIR/metrics.jsonl [--gpus N] [--json OUT]

Per step: the step's phases (``timing_s/*``, s), device memory per phase (``memory/*``, GiB:
``*_peak_gib`` = torch's allocator peak in that phase, ``*_device_used_gib`` = the whole GPU,
vLLM's pool included), the weight sync (seconds, GB/s, path) and tokens per second per GPU:
all prompt + response tokens of the step / (step seconds x GPUs), the figure NeMo-RL publishes; an MoE
run's ``moe/*`` (expert load, router entropy) and ``router_replay/*`` metrics; a multi-turn run's ``agent/*``
(turns per sample: ``num_turns/*`` counts every message, ``assistant_turns`` / ``user_turns`` the model's and the
interaction's turns; tool calls, errors and latency; means over the step's samples).
"""

from __future__ import annotations

import argparse
import json


def rows(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def summary(metrics: dict, gpus: int) -> dict:
    out = {"step": metrics.get("step")}
    out["phases_s"] = {k[len("timing_s/"):]: round(v, 2) for k, v in metrics.items() if k.startswith("timing_s/")}
    out["memory_gib"] = {k[len("memory/"):]: round(v, 1) for k, v in metrics.items() if k.startswith("memory/")}
    out["sync"] = {k[len("weight_sync/"):]: round(v, 3) for k, v in metrics.items() if k.startswith("weight_sync/")}
    step_s = metrics.get("timing_s/step")
    tokens = metrics.get("perf/total_num_tokens")
    if step_s and tokens:
        out["tokens_per_s_per_gpu"] = round(tokens / step_s / gpus, 1)
        out["tokens"] = int(tokens)
    for key in ("response_length/mean", "rollout/log_prob_gap_mean", "rollout/log_prob_gap_max", "actor/grad_norm"):
        if key in metrics:
            out[key] = round(metrics[key], 4)
    agent = {k[len("agent/"):]: round(v, 3) for k, v in metrics.items() if k.startswith("agent/")}
    if agent:
        out["agent"] = agent
    moe = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("moe/", "router_replay/"))}
    if moe:
        out["moe"] = moe
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("metrics")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    table = [summary(m, args.gpus) for m in rows(args.metrics)]
    for row in table:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
