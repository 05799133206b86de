"""Time GAE on a [batch, response_len] batch: the vectorized scan used by megarl
(`gae_advantages_returns`, log2(T) elementwise passes) next to a naive token loop (one
step per position, as in the textbook recurrence), in the same run, and check they agree.
--mask holes adds interior masked spans (multi-turn observation tokens), which takes the
packing path instead of the right-padded fast path.

    python benchmarks/bench_gae.py                     # [1024, 4096] on CPU
    python benchmarks/bench_gae.py --device cuda --repeats 20
"""

from __future__ import annotations

import argparse
import time

import torch

from megarl.algorithms.gae import gae_advantages_returns


def naive_gae(rewards, values, mask, gamma: float, lam: float):
    """Reference: reverse loop over positions, skipping masked tokens."""
    mask = mask.to(rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0])
    last = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new_last = delta + gamma * lam * last
        next_value = values[:, t] * m + (1 - m) * next_value
        last = new_last * m + (1 - m) * last
        adv[:, t] = last * m
    return adv, (adv + values) * mask


def timed(fn, repeats: int, device: str) -> float:
    """Median wall time in ms over `repeats` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--mask", default="right", choices=["right", "holes"])
    args = p.parse_args()

    g = torch.Generator().manual_seed(0)
    B, T = args.batch, args.length
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    if args.mask == "holes":
        mask = mask * (torch.rand(B, T, generator=g) > 0.2).long()
    rewards, values, mask = (x.to(args.device) for x in (rewards, values, mask))

    def vectorized():
        return gae_advantages_returns(rewards, values, mask, args.gamma, args.lam)

    vec_ms = timed(vectorized, args.repeats, args.device)
    loop_ms = timed(lambda: naive_gae(rewards, values, mask, args.gamma, args.lam), args.repeats, args.device)
    adv, ret = gae_advantages_returns(rewards, values, mask, args.gamma, args.lam)
    ref_adv, ref_ret = naive_gae(rewards, values, mask, args.gamma, args.lam)
    err = max((adv - ref_adv).abs().max().item(), (ret - ref_ret).abs().max().item())
    scale = ref_adv.abs().max().item()

    print(
        f"GAE [{B}, {T}] on {args.device} (threads={torch.get_num_threads()}, gamma={args.gamma}, "
        f"lam={args.lam}, mask={args.mask})"
    )
    print(f"  vectorized      : {vec_ms:10.1f} ms")
    print(f"  naive token loop: {loop_ms:10.1f} ms   ({loop_ms / vec_ms:.1f}x slower)")
    print(f"  max |difference|: {err:.2e} (max |advantage| {scale:.1f})")


if __name__ == "__main__":
    main()
