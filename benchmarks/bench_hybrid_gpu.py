"""The colocated worker on one GPU: weight sync into vLLM and rollout, each against a
baseline measured in the same run (issue 16).

  torchrun --nproc_per_node=1 benchmarks/bench_hybrid_gpu.py --shape 1.5b [--enforce-eager] --out hybrid.json

Builds ``ActorRolloutRefWorker`` (Megatron actor bf16 + vLLM engine, ``free_cache_engine``
on, as in a run) on a random model of the shape, then times, alternating, ``--iters`` each:

* weight sync: the direct path (export written into vLLM's parameters; integrity check
  on and off; ``direct_first_checked``: views rebuilt, copies captured and checked, as on
  a run's first sync), the generic path (bucketed stream into vLLM's ``reload_weights``), and the
  baseline: a device-to-device ``copy_`` of every vLLM parameter from a clone (the same
  bytes, the same tensor count);
* rollout: ``generate_sequences`` (megarl's DataProto in/out, wake + sleep of the KV
  cache) against ``llm.generate`` on the same engine, prompts and sampling params
  (standalone vLLM). Run once with and once without ``--enforce-eager`` for CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import QWEN25_1P5B, QWEN25_7B  # noqa: E402

QWEN25_0P5B = dict(QWEN25_1P5B, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                   num_attention_heads=14, num_key_value_heads=2)
SHAPES = {"0.5b": QWEN25_0P5B, "1.5b": QWEN25_1P5B, "7b": QWEN25_7B}


def model_dir(shape: str, root: str) -> str:
    import transformers

    path = os.path.join(root, f"hybrid_{shape}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        cfg = transformers.Qwen2Config(**SHAPES[shape], eos_token_id=151643, bos_token_id=151643, dtype="bfloat16")
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(path, safe_serialization=True)
        del model
        torch.cuda.empty_cache()
    return path


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--skip-sync", action="store_true")
    p.add_argument("--root", default="/tmp")
    p.add_argument("--out", default="hybrid_gpu.json")
    args = p.parse_args()

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from megarl.config import load_config, typed_config
    from megarl.protocol import DataProto
    from megarl.weight_sync.transport import SyncStats
    from megarl.workers.hybrid import ActorRolloutRefWorker

    path = model_dir(args.shape, args.root)
    cfg = typed_config(load_config([
        f"actor_rollout_ref.model.path={path}", "trainer.device=cuda",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.response_len}",
        f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.gpu_memory_utilization=0.35",
        f"actor_rollout_ref.rollout.enforce_eager={str(args.enforce_eager).lower()}",
        "actor_rollout_ref.rollout.ignore_eos=true",  # every response runs to the full length
        "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto",  # no flash-attn here
        "actor_rollout_ref.actor.megatron.sequence_parallel=false", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]))
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout", device="cuda")
    worker.init_model()
    ws = worker.weight_sync
    assert ws.direct is not None, "direct path not chosen"
    direct = ws.direct
    result: dict = {"shape": args.shape, "enforce_eager": args.enforce_eager, "device": torch.cuda.get_device_name()}

    if not args.skip_sync:
        worker.sync_weights()  # the engine sleeps at level 2 after init: its parameters have memory again only after a sync
        vllm_params = [p.data for _, p in worker.rollout.model().named_parameters()]
        clones = [p.detach().clone() for p in vllm_params]
        nbytes = sum(p.numel() * p.element_size() for p in vllm_params)

        def d2d():
            for dst, src in zip(vllm_params, clones):
                dst.copy_(src)

        def sync(path: str, check: bool, rebuild: bool = False):
            ws.direct = direct if path == "direct" else None
            if rebuild:  # as on the first sync: views, graph capture and the bitwise check
                direct._pairs = None
            ws.integrity_check = check
            ws.mark_changed()
            return worker.sync_weights()

        variants = {"d2d_copy": lambda: d2d(), "direct_checked": lambda: sync("direct", True),
                    "direct_unchecked": lambda: sync("direct", False),
                    "direct_first_checked": lambda: sync("direct", True, rebuild=True),
                    "reload_checked": lambda: sync("reload", True)}
        for fn in variants.values():  # warm-up (exporter buffers, vLLM reload machinery)
            fn()
        times: dict[str, list[float]] = {k: [] for k in variants}
        peaks: dict[str, float] = {}
        for _ in range(args.iters):
            for name, fn in variants.items():
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                times[name].append(timed(fn))
                peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated() - base)
        del clones
        torch.cuda.empty_cache()
        d2d_s = statistics.median(times["d2d_copy"])
        result["sync"] = {name: {"median_s": statistics.median(t), "gb_per_s": nbytes / statistics.median(t) / 1e9,
                                 "vs_d2d": d2d_s / statistics.median(t), "peak_extra_gib": peaks[name] / 2**30,
                                 "all_s": t} for name, t in times.items()}
        result["sync_bytes"] = nbytes
        # where a direct sync's time goes (each part timed alone, CUDA-synchronised)
        engine = worker.actor.engine
        parts = {"graph_replay": lambda: direct._graph.replay(),
                 "load_from": lambda: direct.load_from(engine.chunks, engine.hf_config, bucket_size_bytes=worker.bucket_size_bytes,
                                                       integrity_check=False, stats=SyncStats()),
                 "reset_prefix_cache": lambda: worker.rollout.reset_prefix_cache(),
                 "actor_onload_offload": lambda: (worker.actor.onload(), worker.actor.offload()),
                 "wake_up_awake": lambda: worker.rollout.wake_up()}
        result["sync_parts_ms"] = {name: 1e3 * statistics.median([timed(fn) for _ in range(args.iters)])
                                   for name, fn in parts.items()}
        print("# direct sync parts (ms):", {k: round(v, 2) for k, v in result["sync_parts_ms"].items()}, flush=True)
        ws.direct, ws.integrity_check = direct, True
        ws.mark_changed()
        worker.sync_weights()

    # rollout: megarl's generate_sequences vs llm.generate on the same engine
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 150000, (args.prompts, args.prompt_len), generator=g)
    mask = torch.ones_like(ids)
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                   "position_ids": torch.arange(args.prompt_len).expand_as(ids).clone()},
                                  {"uid": [str(i) for i in range(args.prompts)]})
    params = worker.rollout.sampling_params(validate=False, do_sample=True)
    raw_prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in ids]

    def standalone():
        worker.rollout.llm.generate(raw_prompts, params, use_tqdm=False)

    def megarl():
        worker.generate_sequences(prompts, validate=False, do_sample=True)

    def ready():  # untimed: generate_sequences ends asleep at level 2; both arms start from synced weights
        worker.sync_weights()
        worker.rollout.wake_up()

    for fn in (megarl, standalone):  # warm-up
        ready()
        fn()
    rollout: dict[str, list[float]] = {"standalone_vllm": [], "megarl_generate_sequences": []}
    for _ in range(args.iters):
        for name, fn in (("standalone_vllm", standalone), ("megarl_generate_sequences", megarl)):
            ready()
            rollout[name].append(timed(fn))
    tokens = args.prompts * args.n * args.response_len
    base = statistics.median(rollout["standalone_vllm"])
    result["rollout"] = {name: {"median_s": statistics.median(t), "tok_per_s": tokens / statistics.median(t),
                                "overhead_vs_standalone": statistics.median(t) / base - 1, "all_s": t}
                         for name, t in rollout.items()}
    result["rollout_tokens"] = tokens
    worker.shutdown()

    print(f"# hybrid worker, {args.shape}, {result['device']}, enforce_eager={args.enforce_eager}")
    for name, r in result.get("sync", {}).items():
        print(f"sync {name:18s} {r['median_s']*1e3:8.1f} ms  {r['gb_per_s']:7.1f} GB/s  {r['vs_d2d']*100:5.1f}% of d2d  "
              f"peak extra {r['peak_extra_gib']:.2f} GiB")
    for name, r in result["rollout"].items():
        print(f"rollout {name:26s} {r['median_s']:7.2f} s  {r['tok_per_s']:9.0f} tok/s  "
              f"{r['overhead_vs_standalone']*100:+5.1f}% vs standalone")
    with open(os.path.join(os.environ.get("OUT", "."), args.out), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
