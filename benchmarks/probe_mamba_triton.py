"""Can a GPU run Nemotron-H's Mamba-2 layers without mamba-ssm's and causal-conv1d's compiled extensions?
(issue 34's gap). mamba-ssm's chunked SSD scan is Triton (``mamba_ssm/ops/triton/ssd_combined.py``, with its
backward); only its package ``__init__`` needs the compiled ``selective_scan_cuda``. This probe loads the Triton
modules from mamba-ssm's source without that ``__init__`` and runs ``mamba_chunk_scan_combined`` forward and
backward against megarl's torch scan (``megarl.compat.megatron_core.mamba_torch._ssd_scan``, exact in fp32, the
reference), fp32, at a Nemotron-3-Nano layer's shape (64 heads x 64, state 128, 8 groups, chunk 128) per token
count: max |y| and |dx| differences, seconds and peak memory of each (the torch scan's ``[chunks, chunk, chunk,
heads]`` fp32 tensors are why it is CPU-only today).

  python3 benchmarks/probe_mamba_triton.py --src /tmp/mamba_src/mamba_ssm-2.3.2.post1 [--tokens 1024 8192]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types

import torch


def load_triton_scan(src: str):
    """``mamba_chunk_scan_combined`` from the source tree ``src`` (its ``mamba_ssm`` package's modules, not its
    ``__init__``)."""
    package = types.ModuleType("mamba_ssm")
    package.__path__ = [f"{src}/mamba_ssm"]
    sys.modules["mamba_ssm"] = package
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined


def run(fn, inputs: list[torch.Tensor]) -> dict:
    """fn's output, the inputs' gradients of ``sum(y * w)``, seconds and peak memory above the start (GiB)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start_mem, start = torch.cuda.memory_allocated(), time.perf_counter()
    y = fn(*leaves).float()
    w = torch.linspace(-1, 1, y.numel(), device=y.device).reshape(y.shape)
    (y * w).sum().backward()
    torch.cuda.synchronize()
    return {"y": y.detach(), "grads": [t.grad for t in leaves], "s": time.perf_counter() - start,
            "peak_gib": (torch.cuda.max_memory_allocated() - start_mem) / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="mamba-ssm's unpacked source tree")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--state", type=int, default=128)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from megarl.compat.megatron_core.mamba_torch import _ssd_scan

    triton_scan = load_triton_scan(args.src)
    h, p, n, g, c = args.heads, args.headdim, args.state, args.groups, args.chunk

    def triton_fn(x, dt, A, B, C):
        return triton_scan(x, dt, A, B, C, chunk_size=c)

    def torch_fn(x, dt, A, B, C):
        B, C = (t.repeat_interleave(h // g, dim=2) for t in (B, C))
        return _ssd_scan(x, dt, A, B, C, c)

    rows = []
    for tokens in args.tokens:
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        x = torch.randn(1, tokens, h, p, device="cuda", generator=gen)
        dt = torch.nn.functional.softplus(torch.randn(1, tokens, h, device="cuda", generator=gen) - 2)
        A = -torch.rand(h, device="cuda", generator=gen) - 0.5
        B, C = (torch.randn(1, tokens, g, n, device="cuda", generator=gen) / n**0.5 for _ in range(2))
        # the second of two runs each: the first compiles (Triton) and autotunes
        tri, ref = ([run(fn, [x, dt, A, B, C]) for _ in range(2)][1] for fn in (triton_fn, torch_fn))
        row = {"tokens": tokens,
               "y_max_diff": float((tri["y"] - ref["y"]).abs().max()), "y_max": float(ref["y"].abs().max()),
               "grad_max_diff": [float((a - b).abs().max()) for a, b in zip(tri["grads"], ref["grads"])],
               "triton_s": round(tri["s"], 4), "torch_s": round(ref["s"], 4),
               "triton_peak_gib": round(tri["peak_gib"], 3), "torch_peak_gib": round(ref["peak_gib"], 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
