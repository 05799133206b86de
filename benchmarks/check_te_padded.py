"""Actor log-probs and one update through megarl's ActorWorker, per layer spec and layout.

Issue 23: with transformer-engine's spec, a GRPO step on padded batches stopped with a NaN
gradient. This runs the smallest path that shows it, on one GPU: a random HF model of a
Qwen2.5 shape, a GRPO-shaped batch (left-padded prompts, right-padded responses), then for
each variant (spec x layout) `compute_log_prob` and `update_policy`, and reports

* whether the log-probs and every parameter gradient are finite, and the grad norm;
* the largest / mean |log-prob - HF transformers| over response tokens (HF fp32, with its
  attention mask), next to the same figure for HF *without* the mask (how much attending
  to the padding would change them: the check's sensitivity);
* with --localize, for a variant with non-finite gradients, the first module whose
  output or output-gradient turned non-finite.

Works against any megarl checkout on PYTHONPATH (older ones ignore the spec choice).

  torchrun --nproc_per_node=1 benchmarks/check_te_padded.py --shape 0.5b \\
      --variants transformer_engine:padded,transformer_engine:packed,local:padded
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import QWEN2_TINY, QWEN25_1P5B, init_process_group, rank0_print, sync  # noqa: E402

QWEN25_0P5B: dict = dict(
    QWEN25_1P5B, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
)
QWEN25_3B: dict = dict(
    QWEN25_1P5B, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
    num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
)
SHAPES = {"0.5b": QWEN25_0P5B, "1.5b": QWEN25_1P5B, "3b": QWEN25_3B, "tiny": QWEN2_TINY,
          "0.5b-v1k": dict(QWEN25_0P5B, vocab_size=1024)}  # the GPU e2e run's model: the demo tokenizer's small vocabulary
PAD_ID = 151643 % 512  # any id inside every shape's vocabulary


def grpo_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> dict:
    """Left-padded prompts + right-padded responses of random lengths (at least one row of
    each full length), random tokens, pad id PAD_ID."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, prompt_len + 1, (rows,), generator=g)
    r_lens = torch.randint(1, response_len + 1, (rows,), generator=g)
    p_lens[0], r_lens[-1] = prompt_len, response_len
    p_mask = (torch.arange(prompt_len) >= prompt_len - p_lens[:, None]).long()
    r_mask = (torch.arange(response_len) < r_lens[:, None]).long()
    mask = torch.cat([p_mask, r_mask], 1)
    ids = torch.randint(0, vocab, mask.shape, generator=g)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID))
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt_len:].contiguous(),
        "response_mask": r_mask,
        "advantages": torch.randn(rows, response_len, generator=g) * r_mask,
    }


def hf_log_probs(model_dir: str, batch: dict, response_len: int, use_mask: bool, device) -> torch.Tensor:
    """HF transformers fp32 log-probs of the responses `[B, R]` (0 where padded)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    out = []
    with torch.no_grad():
        for i in range(0, batch["input_ids"].shape[0], 4):
            sl = {k: v[i : i + 4].to(device) for k, v in batch.items()}
            logits = model(
                input_ids=sl["input_ids"],
                attention_mask=sl["attention_mask"] if use_mask else None,
                position_ids=sl["position_ids"],
            ).logits[:, -response_len - 1 : -1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, sl["responses"].unsqueeze(-1)).squeeze(-1)
            out.append((logp * sl["response_mask"]).cpu())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return torch.cat(out)


def actor_cfg(model_dir: str, impl: str, packed: bool, rows: int, micro: int):
    """A real run's actor config (verl's defaults): one mini-batch of `rows`, micro-batches of `micro`."""
    from _actor_path import actor_config

    return actor_config(model_dir, 1, micro, rows // micro, packed, dist_opt=torch.cuda.is_available(), impl=impl)


def nonfinite_grads(worker) -> list[str]:
    from megarl.models import unwrap_chunk

    bad = []
    for chunk in worker.engine.chunks:
        for name, p in unwrap_chunk(chunk).named_parameters():
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None and not torch.isfinite(g).all():
                bad.append(name)
    return bad


def localize(worker, data) -> list[str]:
    """Re-run update_policy with hooks; the first non-finite forward output and the first
    non-finite output gradient (backward order), with the module run just before each."""
    from megarl.models import unwrap_chunk

    events: list[tuple[str, str, bool]] = []
    handles = []

    def fwd_hook(name):
        def hook(module, inputs, output):
            t = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return
            events.append(("fwd", name, bool(torch.isfinite(t).all())))
            if t.requires_grad:
                t.register_hook(lambda g: events.append(("bwd", name, bool(torch.isfinite(g).all()))))
        return hook

    for chunk in worker.engine.chunks:
        for name, mod in unwrap_chunk(chunk).named_modules():
            if name:
                handles.append(mod.register_forward_hook(fwd_hook(name)))
    try:
        worker.update_policy(data)
    finally:
        for h in handles:
            h.remove()
    lines = []
    for phase in ("fwd", "bwd"):
        seq = [e for e in events if e[0] == phase]
        first = next((i for i, e in enumerate(seq) if not e[2]), None)
        if first is None:
            lines.append(f"{phase}: all finite ({len(seq)} events)")
        else:
            before = seq[first - 1][1] if first else "-"
            lines.append(f"{phase}: first non-finite at event {first}/{len(seq)}: {seq[first][1]} (previous: {before})")
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--response", type=int, default=128)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--variants", default="transformer_engine:padded,transformer_engine:packed,local:padded,local:packed")
    p.add_argument("--localize", action="store_true")
    p.add_argument("--no-hf", action="store_true", help="skip the HF reference (timing runs)")
    p.add_argument("--round-len", type=int, default=1,
                   help="padded layout: round each micro-batch's length up to this multiple (fewer distinct shapes)")
    p.add_argument("--profile", action="store_true", help="torch profiler table of one log-prob + update")
    p.add_argument("--time-iters", type=int, default=0, help="also time N update_policy calls per variant")
    args = p.parse_args()

    device = init_process_group()
    if args.round_len > 1:  # experiment: bucket the padded micro-batch lengths
        import megarl.workers.megatron.engine as engine_mod
        from megarl.workers.megatron.inputs import build_inputs, valid_length

        def bucketed(input_ids, attention_mask, position_ids, *, remove_padding, pad_multiple=1, length=None, **kw):
            if not remove_padding and length is None:
                length = valid_length(attention_mask, args.round_len * pad_multiple)
            return build_inputs(input_ids, attention_mask, position_ids, remove_padding=remove_padding,
                                pad_multiple=pad_multiple, length=length, **kw)

        engine_mod.build_inputs = bucketed
    from _actor_path import write_random_hf_dir

    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker

    shape = SHAPES[args.shape]
    model_dir = write_random_hf_dir(shape, f"/tmp/check_te_{args.shape}")
    batch = grpo_batch(args.rows, args.prompt, args.response, shape["vocab_size"])
    rm = batch["response_mask"].bool()
    if args.no_hf:
        ref = ref_nomask = torch.full(rm.shape, float("nan"))
    else:
        ref = hf_log_probs(model_dir, batch, args.response, True, device)
        ref_nomask = hf_log_probs(model_dir, batch, args.response, False, device)
    rank0_print(f"# HF with vs without attention mask: max {float((ref - ref_nomask)[rm].abs().max()):.4f} "
                f"mean {float((ref - ref_nomask)[rm].abs().mean()):.5f}  (tokens {int(rm.sum())})")

    rows = []
    for variant in args.variants.split(","):
        impl, layout = variant.split(":")
        worker = ActorWorker(actor_cfg(model_dir, impl, layout == "packed", args.rows, args.micro), role="actor",
                             device=device.type)
        worker.init_model()
        built = getattr(worker.engine, "transformer_impl", None) or "transformer_engine?(old megarl)"
        if built == "transformer_engine" and variant == args.variants.split(",")[0]:
            from megarl.models import unwrap_chunk

            names = [n for n, _ in unwrap_chunk(worker.engine.chunks[0]).named_parameters() if ".layers." not in n
                     or ".layers.0." in n]
            rank0_print(f"TE parameter names (layer 0 and outside layers): {names}")
        data = DataProto.from_dict(dict(batch), meta_info={"temperature": 1.0, "nan_policy": "stop"})
        out = worker.compute_log_prob(data)
        logp = out.batch["old_log_probs"]
        data.batch["old_log_probs"] = logp
        metrics = worker.update_policy(data)
        gnorm = metrics.get("actor/grad_norm", float("nan"))
        gnorm = gnorm[0] if isinstance(gnorm, list) else gnorm
        bad = nonfinite_grads(worker)
        diff = (logp - ref)[rm].abs()
        row = (variant, built, bool(torch.isfinite(logp).all()), float(gnorm), len(bad),
               float(diff.max()), float(diff.mean()))
        rows.append(row)
        rank0_print(f"{variant}: built {built}; log-probs finite {row[2]}; grad_norm {row[3]:.4g}; "
                    f"params with non-finite grads {len(bad)} {bad[:3]}{'...' + bad[-1] if len(bad) > 3 else ''}; "
                    f"|logp - HF| max {row[5]:.4f} mean {row[6]:.5f}")
        if bad and args.localize:
            for line in localize(worker, data):
                rank0_print("   ", line)
        if args.time_iters:
            sync(device)
            times = []
            for _ in range(args.time_iters):
                t0 = time.perf_counter()
                worker.update_policy(data)
                sync(device)
                times.append(time.perf_counter() - t0)
            rank0_print(f"   update_policy s: {' '.join(f'{t:.3f}' for t in times)}")
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                worker.compute_log_prob(data)
                worker.update_policy(data)
                sync(device)
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
            rank0_print(f"   profile (compute_log_prob + update_policy):\n{table}")
        del worker, out
        if device.type == "cuda":
            torch.cuda.empty_cache()

    rank0_print(f"\n# {args.shape} rows {args.rows} prompt<={args.prompt} response<={args.response} micro {args.micro}")
    rank0_print(f"{'variant':<30} {'built':<20} {'logp ok':>7} {'grad_norm':>10} {'bad':>4} {'max|d|':>8} {'mean|d|':>8}")
    for r in rows:
        rank0_print(f"{r[0]:<30} {r[1]:<20} {str(r[2]):>7} {r[3]:10.4g} {r[4]:4d} {r[5]:8.4f} {r[6]:8.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
