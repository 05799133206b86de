"""Where a rollout vs trainer log-prob gap comes from: vLLM's log-probs of the responses it sampled, megarl's
(per layout) and HF transformers' of the same tokens, each set against HF in fp32, the yardstick neither side
computes with.

Two stages, vLLM and Megatron in separate processes as in a run:

  python benchmarks/gap_probe.py generate --model DIR --out /tmp/gap/batch.pt \\
      [--prompts 8 --n 2 --prompt-len 256 --response-len 2048]
  torchrun --nproc_per_node=2 benchmarks/gap_probe.py score --model DIR --batch /tmp/gap/batch.pt \\
      [--layouts tp1,tp2,pp2,pp2_dyn] [--out gap.json]

``generate``: megarl's RolloutWorker (vLLM, one TP=1 replica, the run's engine settings, ``load_format=auto``)
samples ``--n`` responses to each of ``--prompts`` random-token prompts at temperature 1 with ``ignore_eos`` and
records their log-probs as a run does (``calculate_log_probs``). ``score``: megarl's reference worker
(``ActorWorker`` role ``ref``: the old-log-prob pass's code) at each layout (``tpN``, ``ppN``, ``tpNppM``; suffix
``_dyn``: dynamic batch size at 24,576 tokens a micro-batch, the packed path), and on rank 0 HF transformers in
fp32 and bf16. Prints mean / max |d| of every pair over response tokens, and the mean |d| by quarter of the
response, so a gap that grows along the response shows itself. The 2026-11-28 8B run's gap (issue 34): 0.063
mean, 5x the 30B-A3B's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
DYN_TOKENS = 24_576  # the 8B run's log_prob_max_token_len_per_gpu


def generate(args: argparse.Namespace) -> None:
    from megarl.config import load_config, typed_config
    from megarl.protocol import DataProto
    from megarl.workers.rollout import RolloutWorker

    r = "actor_rollout_ref.rollout"
    cfg = load_config([f"actor_rollout_ref.model.path={args.model}", f"data.max_prompt_length={args.prompt_len}",
                       f"data.max_response_length={args.response_len}", f"{r}.n={args.n}", f"{r}.load_format=auto",
                       f"{r}.tensor_model_parallel_size=1", f"{r}.calculate_log_probs=true", f"{r}.ignore_eos=true",
                       f"{r}.gpu_memory_utilization={args.gpu_memory_utilization}", f"{r}.temperature=1.0",
                       *([] if torch.cuda.is_available() else ["trainer.device=cpu"])])
    worker = RolloutWorker(typed_config(cfg).actor_rollout_ref, args.model)
    vocab = worker.llm.llm_engine.model_config.get_vocab_size()
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(vocab // 8, vocab - vocab // 8, (args.prompts, args.prompt_len), generator=g)  # no special ids
    mask = torch.ones_like(ids)
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
                                  {"uid": [str(i) for i in range(args.prompts)]})
    out = worker.generate_sequences(prompts, validate=False, do_sample=True)
    keep = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "rollout_log_probs")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    torch.save({k: out.batch[k].cpu() for k in keep}, args.out)
    print(f"gap_probe: {len(ids)} x {args.n} responses of {int(out.batch['response_mask'].sum(-1).max())} tokens -> {args.out}")
    worker.shutdown()


def parse_layout(name: str) -> tuple[int, int, bool]:
    """``tp2``, ``pp2``, ``tp2pp2``, with ``_dyn``: (tp, pp, dynamic batch size)."""
    m = re.fullmatch(r"(?:tp(\d+))?(?:pp(\d+))?(_dyn)?", name)
    if m is None or not (m.group(1) or m.group(2)):
        raise SystemExit(f"layout {name!r}: expected tpN, ppN or tpNppM, optionally with _dyn")
    return int(m.group(1) or 1), int(m.group(2) or 1), bool(m.group(3))


def megarl_log_probs(model_dir: str, batch: dict, layout: str, device: torch.device) -> torch.Tensor:
    """The reference worker's per-token log-probs ``[B, R]`` at ``layout`` (every rank gets every row)."""
    from megatron.core import parallel_state

    from megarl.config import load_config, typed_config
    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker

    tp, pp, dyn = parse_layout(layout)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    overrides = [f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                 f"actor_rollout_ref.ref.log_prob_use_dynamic_bsz={str(dyn).lower()}",
                 f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={DYN_TOKENS}"]
    for role in ("actor", "ref"):
        m = f"actor_rollout_ref.{role}.megatron"
        overrides += [f"{m}.tensor_model_parallel_size={tp}", f"{m}.pipeline_model_parallel_size={pp}",
                      f"++{m}.override_transformer_config.attention_backend=auto",
                      *([] if device.type == "cuda" else [f"{m}.dtype=float32",
                                                          f"++{m}.override_transformer_config.transformer_impl=local"])]
    cfg = typed_config(load_config(overrides)).actor_rollout_ref
    worker = ActorWorker(cfg, role="ref", device=device.type)
    worker.init_model()
    data = DataProto.from_dict({k: v for k, v in batch.items() if k != "rollout_log_probs"}, meta_info={"temperature": 1.0})
    logp = worker.compute_log_prob(data).batch["ref_log_prob"].float().cpu()
    del worker
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return logp


@torch.no_grad()
def hf_log_probs(model_dir: str, batch: dict, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """HF transformers' response log-probs ``[B, R]`` (SDPA, log-softmax in fp32), one row at a time."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    R = batch["responses"].shape[1]
    rows = []
    for i in range(batch["input_ids"].shape[0]):
        logits = model(input_ids=batch["input_ids"][i:i + 1].to(device),
                       attention_mask=batch["attention_mask"][i:i + 1].to(device),
                       position_ids=batch["position_ids"][i:i + 1].to(device)).logits[:, -R - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, batch["responses"][i:i + 1].to(device)[..., None])[..., 0]
        rows.append(logp.cpu())
        del logits
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return torch.cat(rows) * batch["response_mask"]


def compare(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    """mean / max |a - b| over response tokens, and the mean by quarter of the response positions."""
    d = (a - b).abs() * mask
    quarters = torch.tensor_split(torch.arange(d.shape[1]), 4)
    by_quarter = [(d[:, q].sum() / mask[:, q].sum().clamp(min=1)).item() for q in quarters]
    return {"mean": (d.sum() / mask.sum()).item(), "max": d.max().item(), "mean_by_quarter": by_quarter}


def score(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from _common import init_process_group

    device = init_process_group()
    batch = torch.load(args.batch)
    mask = batch["response_mask"].float()
    runs = {layout: megarl_log_probs(args.model, batch, layout, device) for layout in args.layouts.split(",")}
    if dist.get_rank() == 0:
        hf32 = hf_log_probs(args.model, batch, torch.float32, device)
        hf16 = hf_log_probs(args.model, batch, torch.bfloat16, device)
        rollout = batch["rollout_log_probs"].float()
        pairs = {"rollout_vs_hf_fp32": (rollout, hf32), "hf_bf16_vs_hf_fp32": (hf16, hf32)}
        for layout, logp in runs.items():
            pairs[f"{layout}_vs_hf_fp32"] = (logp, hf32)
            pairs[f"rollout_vs_{layout}"] = (rollout, logp)
        results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "response_tokens": int(mask.sum()), "hf_fp32_mean_log_prob": (hf32.sum() / mask.sum()).item(),
                   "pairs": {k: compare(a, b, mask) for k, (a, b) in pairs.items()}}
        print(f"# log-prob agreement over {results['response_tokens']} response tokens "
              f"(HF fp32 mean log-prob {results['hf_fp32_mean_log_prob']:.3f})")
        print(f"{'pair':<28} {'mean|d|':>8} {'max|d|':>8}   mean|d| by response quarter")
        for k, v in results["pairs"].items():
            print(f"{k:<28} {v['mean']:8.5f} {v['max']:8.4f}   " + " ".join(f"{q:.5f}" for q in v["mean_by_quarter"]))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="stage", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--prompts", type=int, default=8)
    g.add_argument("--n", type=int, default=2)
    g.add_argument("--prompt-len", type=int, default=256)
    g.add_argument("--response-len", type=int, default=2048)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    g.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score")
    s.add_argument("--model", required=True)
    s.add_argument("--batch", required=True)
    s.add_argument("--layouts", default="tp1,tp2,pp2,pp2_dyn")
    s.add_argument("--out", default=None)
    args = p.parse_args()
    generate(args) if args.stage == "generate" else score(args)


if __name__ == "__main__":
    main()
