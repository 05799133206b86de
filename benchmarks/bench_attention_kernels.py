"""Causal attention kernels torch offers, at the actor benchmark's per-GPU shape.

Shape: Qwen2.5-1.5B at TP=2 -> 6 query heads, 1 KV head, head dim 128, micro-batch 4,
seq 4096 (bf16). Forward + backward per call; TFLOP/s counts causal attention only
(2 matmuls x 2*s*s*hd*heads*b / 2 forward, x3.5 for fwd+bwd with flash's recompute not
counted: the usual 3x).

Variants:
  flash_causal_gqa    SDPA is_causal=True, enable_gqa (flash backend)
  flash_causal_rep    SDPA is_causal=True, KV heads repeated first
  cudnn_causal_rep    SDPA cuDNN backend, KV repeated
  efficient_mask_rep  SDPA with an explicit [s, s] bool mask (what a masked call gets)
  varlen_causal       torch.nn.attention.varlen.varlen_attn over the packed batch (thd)

Run: python benchmarks/bench_attention_kernels.py   (one GPU)
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import median, time_it, write_json  # noqa: E402


def main() -> None:
    device = torch.device("cuda")
    b, s, hq, hkv, hd = 4, 4096, 6, 1, 128
    dtype = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, hq, s, hd, device=device, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(b, hkv, s, hd, device=device, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(b, hkv, s, hd, device=device, dtype=dtype, generator=g).requires_grad_()
    grad = torch.randn(b, hq, s, hd, device=device, dtype=dtype, generator=g)
    flops = 3.0 * 2 * 2 * b * hq * s * s * hd / 2  # fwd + bwd (3x fwd), causal half
    mask = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def rep(t):
        return t.repeat_interleave(hq // hkv, dim=1)

    ref = F.scaled_dot_product_attention(q.float(), rep(k).float(), rep(v).float(), is_causal=True)

    def run(fn):
        out = fn()
        out.backward(grad)
        return out

    variants = {}

    def flash_gqa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def flash_rep():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)

    def cudnn_rep():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)

    def efficient_mask():
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=mask)

    variants.update(
        flash_causal_gqa=flash_gqa,
        flash_causal_rep=flash_rep,
        cudnn_causal_rep=cudnn_rep,
        efficient_mask_rep=efficient_mask,
    )
    info = {"torch": torch.__version__}
    try:
        from torch.nn.attention import varlen

        sig = inspect.signature(varlen.varlen_attn)
        info["varlen_signature"] = str(sig)
        cu = torch.arange(0, (b + 1) * s, s, device=device, dtype=torch.int32)
        kw = {"window_size": (-1, 0)} if "window_size" in sig.parameters else {"is_causal": True}
        gqa = "enable_gqa" in sig.parameters

        def varlen_causal():
            qt = q.permute(0, 2, 1, 3).reshape(b * s, hq, hd)
            kk, vv = (k, v) if gqa else (rep(k), rep(v))
            kt = kk.permute(0, 2, 1, 3).reshape(b * s, kk.shape[1], hd)
            vt = vv.permute(0, 2, 1, 3).reshape(b * s, vv.shape[1], hd)
            extra = {"enable_gqa": True} if gqa else {}
            out = varlen.varlen_attn(qt, kt, vt, cu, cu, s, s, **kw, **extra)
            return out.reshape(b, s, hq, hd).permute(0, 2, 1, 3)

        variants["varlen_causal"] = varlen_causal
    except Exception:
        info["varlen_error"] = traceback.format_exc(limit=2)

    rows = []
    for name, fn in variants.items():
        try:
            out = fn()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            times = time_it(lambda fn=fn: run(fn), device, 3, 10)
            t = median(times)
            rows.append(dict(name=name, ms=1e3 * t, tflops=flops / t / 1e12, rel_err=err))
        except Exception as e:  # backend not available for this shape
            rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
    write_json("attention_kernels.json", dict(info=info, shape=dict(b=b, s=s, hq=hq, hkv=hkv, hd=hd), rows=rows))
    print(info)
    print(f"\n# causal attention fwd+bwd, b={b} s={s} heads={hq}/{hkv} hd={hd} bf16")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<20} n/a  {r['error']}")
        else:
            print(f"{r['name']:<20} {r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOP/s  rel err {r['rel_err']:.1e}")


if __name__ == "__main__":
    main()
