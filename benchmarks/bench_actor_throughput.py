"""Actor training throughput: plain megatron-core loop vs megarl's actor update path.

Same model shape (Qwen2.5-1.5B, random bf16 weights), same TP layout and the same
tokens per optimizer step in one run:

  (a) plain: GPTModel (``--impl local``: local spec + SDPA core attention, defined in
      _common.py; ``--impl transformer_engine``: megatron's TE spec), megatron DDP +
      distributed optimizer, forward_backward_func with the built-in cross-entropy.
  (b) megarl: ActorWorker.update_policy on a DataProto of full-length sequences (prompt
      and response, no padding), PPO clipped loss, same micro-batch and mini-batch, the
      same layer spec (``override_transformer_config.transformer_impl``).

FLOPs per token = 6*N + 6*L*s*d (see _common.train_flops_per_token); MFU against
989 TFLOP/s dense bf16 per GPU.

Run (2 GPUs):  torchrun --nproc_per_node=2 benchmarks/bench_actor_throughput.py --tp 2 [--impl transformer_engine]
CPU dry run:   torchrun --nproc_per_node=2 benchmarks/bench_actor_throughput.py --tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    H200_BF16_PEAK_TFLOPS,
    QWEN2_TINY,
    QWEN25_1P5B,
    QWEN25_7B,
    init_process_group,
    median,
    plain_gpt_model,
    rank0_print,
    seed_everything,
    sync,
    time_it,
    train_flops_per_token,
    write_json,
)


def make_batches(shape: dict, n_micro: int, micro_bs: int, seq_len: int, device, seed: int):
    """`n_micro` micro-batches of random token ids [micro_bs, seq_len] (same on every rank)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [
        torch.randint(0, shape["vocab_size"], (micro_bs, seq_len), generator=g).to(device)
        for _ in range(n_micro)
    ]


def plain_trainer(shape: dict, seq_len: int, tp: int, device, dtype, impl: str = "local", overrides: dict | None = None,
                  optimizer: str = "adam"):
    """(model wrapped in megatron DDP, distributed optimizer; SGD without momentum: the plain one)
    for the plain loop."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from megatron.core.transformer.module import Float16Module

    # megatron-core's distributed optimizer needs CUDA tensors; CPU dry runs use the plain one.
    dist_opt = torch.device(device).type == "cuda" and optimizer == "adam"
    model = plain_gpt_model(shape, seq_len, tp, dtype, device, impl=impl, overrides=overrides)
    config = model.config
    if dtype != torch.float32:  # as Megatron-LM's get_model does
        model = Float16Module(config, model)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=dist_opt
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp_cfg, module=model)
    opt_cfg = OptimizerConfig(
        optimizer=optimizer,
        sgd_momentum=0.0,
        lr=1e-6,
        weight_decay=0.0,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=dist_opt,
        clip_grad=1.0,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [model])
    return model, optimizer


def plain_step_fn(model, optimizer, batches, seq_len: int, device):
    """One optimizer step over `batches` with megatron's no-pipeline schedule."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    micro_bs = batches[0].shape[0]
    position_ids = torch.arange(seq_len, device=device).unsqueeze(0).expand(micro_bs, -1)

    def forward_step(data_iter, model_):
        tokens = next(data_iter)
        labels = torch.roll(tokens, -1, dims=1)
        per_token_loss = model_(tokens, position_ids, None, labels=labels)  # [b, s] fp32

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"loss": loss.detach()}

        return per_token_loss, loss_func

    def step():
        model.zero_grad_buffer()
        optimizer.zero_grad()
        fb(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=len(batches),
            seq_length=seq_len,
            micro_batch_size=micro_bs,
            forward_only=False,
        )
        optimizer.step()

    return step


def profile_step(step, device, label: str, top: int = 30) -> str:
    """Kernel-time table of one step (CUDA only)."""
    if device.type != "cuda":
        return ""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
        sync(device)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=70)
    shapes = prof.key_averages(group_by_input_shape=True).table(
        sort_by="cuda_time_total", row_limit=top, max_name_column_width=40, max_shapes_column_width=80
    )
    return f"== profile {label} ==\n{table}\n== by input shape ==\n{shapes}"


def install_cpu_compat() -> None:
    """CPU dry runs only: megarl's CPU compatibility layer (points megatron's CUDA calls
    at the CPU)."""
    from megarl.compat.megatron_core.cpu import apply_cpu
    from megarl.compat.megatron_core.optimizer import apply_cpu_optimizer

    apply_cpu()
    apply_cpu_optimizer()


def report(label: str, times: list[float], tokens_per_step: int, flops_per_token: float, world: int):
    t = median(times)
    tok_s = tokens_per_step / t
    tflops_gpu = tok_s * flops_per_token / world / 1e12
    return dict(
        label=label,
        step_s_median=t,
        step_s_all=times,
        tokens_per_step=tokens_per_step,
        tokens_per_s=tok_s,
        tokens_per_s_per_gpu=tok_s / world,
        tflops_per_gpu=tflops_gpu,
        mfu=tflops_gpu / H200_BF16_PEAK_TFLOPS,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--n-micro", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="tiny model (CPU dry run)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--skip-megarl", action="store_true")
    p.add_argument("--legacy", action="store_true", help="also time the previous LM-head hooks (same run)")
    p.add_argument("--layouts", default="padded,rmpad",
                   help="megarl arms to run: padded, rmpad (use_remove_padding), padded_unfused (TE's weight-gradient "
                        "accumulation fusion off, as the plain arm); one per process where two workers do not fit")
    p.add_argument("--impl", default="local", choices=["local", "transformer_engine"],
                   help="layer spec of both arms (megatron's transformer_impl)")
    p.add_argument("--shape", default="1.5b", choices=["1.5b", "7b"])
    p.add_argument("--layers", type=int, default=0, help="keep the shape's layer size, use this many layers "
                   "(a 7B shape with Adam state does not fit one 80 GB GPU at 28 layers)")
    p.add_argument("--fp8", action="store_true", help="both arms: TE FP8 (fp8=hybrid, delayed scaling); needs --impl "
                   "transformer_engine")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"],
                   help="sgd: no momentum, no optimizer state, both arms (the whole 7B model fits one H200)")
    p.add_argument("--megarl-first", action="store_true",
                   help="time megarl's arm before the plain one (the later arm runs on a warmer GPU)")
    p.add_argument("--out", default="actor_throughput.json")
    args = p.parse_args()

    device = init_process_group()
    from megatron.core import parallel_state as mpu

    if device.type == "cpu":
        install_cpu_compat()
    mpu.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    world = dist.get_world_size()
    dp = mpu.get_data_parallel_world_size()
    shape = QWEN2_TINY if args.tiny else {"1.5b": QWEN25_1P5B, "7b": QWEN25_7B}[args.shape]
    if args.layers:
        shape = dict(shape, num_hidden_layers=args.layers)
    overrides = {"fp8": "hybrid", "fp8_recipe": "delayed"} if args.fp8 else {}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    seq = 64 if args.tiny else args.seq
    fpt = train_flops_per_token(shape, seq)
    # Each DP rank gets its own micro-batches; tokens per step count every DP rank.
    tokens_per_step = args.micro_bs * args.n_micro * seq * dp
    results = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        world=world,
        tp=args.tp,
        dp=dp,
        seq=seq,
        micro_bs=args.micro_bs,
        n_micro=args.n_micro,
        impl=args.impl,
        shape=args.shape,
        layers=shape["num_hidden_layers"] if not args.tiny else None,
        fp8=args.fp8,
        flops_per_token=fpt,
        flops_formula="6*N_matmul + 6*L*s*d (causal attention)",
        runs=[],
    )
    batches = make_batches(shape, args.n_micro, args.micro_bs, seq, device, seed=1 + mpu.get_data_parallel_rank())
    profiles = []

    def run_plain() -> None:  # (a) plain megatron-core loop
        seed_everything(1234, device)
        model, optimizer = plain_trainer(shape, seq, args.tp, device, dtype, impl=args.impl, overrides=overrides,
                                         optimizer=args.optimizer)
        step = plain_step_fn(model, optimizer, batches, seq, device)
        times = time_it(step, device, args.warmup, args.iters)
        results["runs"].append(report("a_plain_megatron", times, tokens_per_step, fpt, world))
        if device.type == "cuda":
            results["runs"][-1]["max_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
        if args.profile:
            profiles.append(profile_step(step, device, "a_plain_megatron"))
        del model, optimizer, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    if not args.megarl_first:
        run_plain()

    # (b) megarl actor update path: padded layout, then packed (use_remove_padding)
    if not args.skip_megarl:
        from _actor_path import build_actor_step

        layouts = args.layouts.split(",")
        # padded_unfused: megarl without TE's weight-gradient accumulation fusion, the kernels the
        # plain arm runs (megatron-core turns that fusion on only with apex)
        variants = [(rm, False, extra) for rm, name, extra in (
            (False, "padded", {}), (True, "rmpad", {}), (False, "padded_unfused", {"gradient_accumulation_fusion": False}),
        ) if name in layouts]
        variants += [(False, True, {})] if args.legacy else []
        for remove_padding, legacy, extra in variants:
            label = ("b_megarl_actor" + ("_rmpad" if remove_padding else "") + ("_legacy_head" if legacy else "")
                     + ("_unfused" if extra else ""))
            try:
                step_b, worker = build_actor_step(
                    shape, seq, args.tp, args.micro_bs, args.n_micro, device, batches, remove_padding=remove_padding,
                    legacy=legacy, impl=args.impl, overrides={**overrides, **extra}, optimizer=args.optimizer,
                )
                times = time_it(step_b, device, args.warmup, args.iters)
                results["runs"].append(report(label, times, tokens_per_step, fpt, world))
                if device.type == "cuda":
                    results["runs"][-1]["max_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
                if args.profile:
                    profiles.append(profile_step(step_b, device, label))
                del step_b, worker
            except Exception:
                results[label + "_error"] = traceback.format_exc()
                rank0_print(f"{label} failed:\n" + results[label + "_error"])
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)

    if args.megarl_first:
        run_plain()
    results.update(optimizer=args.optimizer, order="megarl first" if args.megarl_first else "plain first")
    runs = {r["label"]: r for r in results["runs"]}
    for label in ("b_megarl_actor", "b_megarl_actor_rmpad", "b_megarl_actor_legacy_head", "b_megarl_actor_unfused"):
        if "a_plain_megatron" in runs and label in runs:
            a, b = runs["a_plain_megatron"], runs[label]
            results[f"overhead_{label}_vs_a_pct"] = 100.0 * (b["step_s_median"] / a["step_s_median"] - 1.0)

    write_json(args.out, results)
    for prof in profiles:
        rank0_print(prof)
    rank0_print(f"\n# actor throughput  impl={args.impl} tp={args.tp} dp={dp} seq={seq} tokens/step={tokens_per_step}")
    rank0_print(f"{'run':<20} {'step s':>8} {'tok/s/GPU':>10} {'TFLOP/s/GPU':>12} {'MFU':>6}")
    for r in results["runs"]:
        rank0_print(
            f"{r['label']:<20} {r['step_s_median']:8.3f} {r['tokens_per_s_per_gpu']:10.0f} "
            f"{r['tflops_per_gpu']:12.1f} {100 * r['mfu']:5.1f}%"
        )
    for key, value in results.items():
        if key.startswith("overhead_"):
            rank0_print(f"{key}: {value:+.2f}%")
    mpu.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
