"""Async (per-request agent loops) vs sync (batched) rollout on one vLLM engine, skewed lengths.

Both paths drive the SAME in-process engine of a megarl ``RolloutWorker`` (random Qwen2-shaped
model, float32 on CPU), alternating, median of ``--repeats``:

* ``single``: one turn per sample, response lengths skewed (``--long-frac`` of the samples get
  ``--long`` tokens, the rest ``--short``; ``ignore_eos``). async = ``AsyncEngine.run`` with one
  coroutine per sample (what ``rollout.mode=async`` runs); sync = one ``LLM.generate`` with
  per-sample ``SamplingParams`` (what ``rollout.mode=sync`` runs). Both batch continuously, so
  the ratio shows the per-request path's overhead, not a speed-up.
* ``multi``: ``--turns`` model turns of ``--short`` tokens with a tool call between them whose
  latency is skewed (``--long-frac`` of the calls take ``--slow-tool-s``, the rest
  ``--fast-tool-s``); observations are ``--obs`` tokens. async = one agent-loop coroutine per
  sample (a sample continues as soon as its own tool returns); the baseline is a turn-lockstep
  batched rollout (each turn one ``LLM.generate`` of every sample, then all tools, waiting for the
  slowest), what a batched multi-turn rollout without per-request scheduling does.

Prints the wall times and ``sync / async`` per scenario (> 1: async is faster).

    python benchmarks/bench_async_rollout.py            # CPU defaults, ~10 min on 2 busy cores
    python benchmarks/bench_async_rollout.py --device cuda --samples 256   # GPU: bf16, CUDA graphs on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_model(out_dir: str, vocab: int) -> str:
    import torch
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    (Path(out_dir) / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "pad_token_id": 0}))
    return out_dir


def make_worker(model_dir: str, args):
    from megarl.config import load_config, typed_config
    from megarl.workers.rollout import RolloutWorker

    max_len = args.prompt + args.turns * (args.short + args.obs) + args.long
    gpu = args.device == "cuda"
    cfg = load_config([
        f"trainer.device={args.device}", "trainer.n_gpus_per_node=1", f"actor_rollout_ref.model.path={model_dir}",
        f"data.max_prompt_length={args.prompt}", f"data.max_response_length={max_len - args.prompt}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.dtype={'bfloat16' if gpu else 'float32'}",
        f"actor_rollout_ref.rollout.enforce_eager={str(not gpu).lower()}", "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.free_cache_engine=false", "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.max_num_seqs={args.samples}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={0.3 if gpu else 0.05}",
    ])
    return RolloutWorker(typed_config(cfg).actor_rollout_ref, model_dir)


def params(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0, detokenize=False)


def lengths(args) -> list[int]:
    every = max(1, round(1 / args.long_frac))
    return [args.long if i % every == 0 else args.short for i in range(args.samples)]


def tool_latencies(args) -> list[list[float]]:
    every = max(1, round(1 / args.long_frac))
    return [[args.slow_tool_s if (i + t) % every == 0 else args.fast_tool_s for t in range(args.turns - 1)]
            for i in range(args.samples)]


def single_async(worker, prompts, args) -> None:
    engine = worker.async_engine
    engine.run([engine.generate(p, params(n)) for p, n in zip(prompts, lengths(args))])


def single_sync(worker, prompts, args) -> None:
    from vllm.inputs import TokensPrompt

    worker.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], [params(n) for n in lengths(args)],
                        use_tqdm=False)


def multi_async(worker, prompts, args) -> None:
    engine, obs = worker.async_engine, [7] * args.obs

    async def sample(prompt, waits):
        ids = list(prompt)
        for turn in range(args.turns):
            ids += (await engine.generate(ids, params(args.short))).token_ids
            if turn < args.turns - 1:
                await asyncio.sleep(waits[turn])  # the tool call
                ids += obs

    engine.run([sample(p, w) for p, w in zip(prompts, tool_latencies(args))])


def multi_lockstep(worker, prompts, args) -> None:
    from vllm.inputs import TokensPrompt

    seqs, obs, waits = [list(p) for p in prompts], [7] * args.obs, tool_latencies(args)
    for turn in range(args.turns):
        outs = worker.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params(args.short), use_tqdm=False)
        for s, o in zip(seqs, outs):
            s += list(o.outputs[0].token_ids)
        if turn < args.turns - 1:
            time.sleep(max(w[turn] for w in waits))  # every tool of the turn, concurrently: the slowest decides
            for s in seqs:
                s += obs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--long", type=int, default=256)
    parser.add_argument("--long-frac", type=float, default=0.125)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--obs", type=int, default=8)
    parser.add_argument("--fast-tool-s", type=float, default=0.05)
    parser.add_argument("--slow-tool-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default="single,multi", help="comma-separated subset of single,multi")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    import random

    vocab = 512
    rng = random.Random(0)
    prompts = [[rng.randrange(2, vocab) for _ in range(args.prompt)] for _ in range(args.samples)]
    with tempfile.TemporaryDirectory() as tmp:
        worker = make_worker(build_model(tmp, vocab), args)
        scenarios = {"single": (single_async, single_sync), "multi": (multi_async, multi_lockstep)}
        results = {}
        for name in args.scenarios.split(","):
            run_async, run_sync = scenarios[name]
            run_async(worker, prompts, args), run_sync(worker, prompts, args)  # warm-up
            times: dict[str, list[float]] = {"async": [], "sync": []}
            for _ in range(args.repeats):
                for label, fn in (("async", run_async), ("sync", run_sync)):
                    start = time.perf_counter()
                    fn(worker, prompts, args)
                    times[label].append(time.perf_counter() - start)
            a, s = statistics.median(times["async"]), statistics.median(times["sync"])
            results[name] = {"async_s": a, "sync_s": s, "sync_over_async": s / a, "runs": times}
            print(f"{name:6s}  async {a:7.3f} s   sync/lockstep {s:7.3f} s   sync / async = {s / a:.2f}", flush=True)
        worker.shutdown()
    results["args"] = vars(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
