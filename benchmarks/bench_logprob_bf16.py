"""bf16 log-prob agreement: megarl's actor log-probs at TP=2 vs TP=1 vs HF transformers.

A Qwen2.5-1.5B-shaped checkpoint with random weights (HF init, initializer_range 0.05 so
that the next-token distributions are far from uniform) is written once; megarl's
ActorWorker (role "ref") computes per-token log-probs of the responses at TP=2, at TP=2
with packed sequences (use_remove_padding), and at TP=1 (both in bf16 on GPU); HF
transformers gives fp32 and bf16 references on GPU 0. Reports mean / max |delta| of the
per-token log-probs over response tokens (report only, nothing tuned).

Batch: 4 rows x 2048 (prompt 512, response 1536); rows 2-3 have left-padded prompts and
row 3 a right-padded response, as rollout batches do.

Run: torchrun --nproc_per_node=2 benchmarks/bench_logprob_bf16.py
CPU dry run: torchrun --nproc_per_node=2 benchmarks/bench_logprob_bf16.py --tiny
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _actor_path import write_random_hf_dir  # noqa: E402
from _common import QWEN2_TINY, QWEN25_1P5B, init_process_group, rank0_print, sync, write_json  # noqa: E402


def make_batch(vocab: int, prompt: int, response: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B = 4
    prompt_pad = torch.tensor([0, 0, prompt // 5, prompt // 2])
    response_len = torch.tensor([response, response, response, response - response // 7])
    prompt_mask = (torch.arange(prompt) >= prompt_pad[:, None]).long()
    response_mask = (torch.arange(response) < response_len[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(0, vocab, (B, prompt + response), generator=g) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, prompt:].contiguous(),
        "response_mask": response_mask,
    }


def megarl_log_probs(model_dir: str, batch: dict, tp: int, remove_padding: bool, device: str) -> torch.Tensor:
    """ActorWorker(role="ref").compute_log_prob at TP=`tp` (every rank gets all rows)."""
    from megatron.core import parallel_state
    from omegaconf import OmegaConf

    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    megatron = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1, "seed": 1}
    cfg = OmegaConf.create(
        {
            "model": {"path": model_dir, "override_config": {}, "use_remove_padding": remove_padding},
            "actor": {"megatron": megatron},
            "ref": {"megatron": megatron, "log_prob_micro_batch_size_per_gpu": 2},
            "rollout": {"n": 1, "temperature": 1.0},
        }
    )
    worker = ActorWorker(cfg, role="ref", device=device)
    worker.init_model()
    out = worker.compute_log_prob(DataProto.from_dict(dict(batch), meta_info={"temperature": 1.0}))
    logp = out.batch["ref_log_prob"].float().cpu()
    del worker
    if device == "cuda":
        torch.cuda.empty_cache()
    return logp


@torch.no_grad()
def hf_log_probs(model_dir: str, batch: dict, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """HF transformers (SDPA) response log-probs and entropies `[B, R]`, fp32 math after the head."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    R = batch["responses"].shape[1]
    logps, ents = [], []
    for i in range(batch["input_ids"].shape[0]):
        logits = model(
            input_ids=batch["input_ids"][i : i + 1].to(device),
            attention_mask=batch["attention_mask"][i : i + 1].to(device),
            position_ids=batch["position_ids"][i : i + 1].to(device),
        ).logits[:, -R - 1 : -1].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logps.append(logp_all.gather(-1, batch["responses"][i : i + 1].to(device).unsqueeze(-1)).squeeze(-1).cpu())
        ents.append((-(logp_all.exp() * logp_all).sum(-1)).cpu())
        del logits, logp_all
    del model
    mask = batch["response_mask"].float()
    return torch.cat(logps) * mask, torch.cat(ents) * mask


def compare(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    d = (a - b).abs()[mask.bool()]
    return {"mean_abs": d.mean().item(), "max_abs": d.max().item(), "p99_abs": d.quantile(0.99).item()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default="logprob_bf16.json")
    args = p.parse_args()
    device = init_process_group()
    shape = dict(QWEN2_TINY if args.tiny else QWEN25_1P5B, initializer_range=0.05)
    prompt, response = (8, 24) if args.tiny else (512, 1536)
    model_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"megarl_logprob_{shape['hidden_size']}")
    write_random_hf_dir(shape, model_dir, seed=3)
    batch = make_batch(shape["vocab_size"], prompt, response)
    mask = batch["response_mask"].float()

    runs = {}
    for name, tp, rmpad in (("tp2", 2, False), ("tp2_rmpad", 2, True), ("tp1", 1, False)):
        runs[name] = megarl_log_probs(model_dir, batch, tp, rmpad, device.type)
        sync(device)
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if dist.get_rank() == 0:
        hf32, ent32 = hf_log_probs(model_dir, batch, torch.float32, device)
        hf16, _ = hf_log_probs(model_dir, batch, torch.bfloat16, device)
        results["reference"] = {
            "hf_fp32_mean_log_prob": (hf32.sum() / mask.sum()).item(),
            "hf_fp32_mean_entropy_nats": (ent32.sum() / mask.sum()).item(),
            "response_tokens": int(mask.sum()),
        }
        pairs = {
            "megarl_tp2_vs_tp1": (runs["tp2"], runs["tp1"]),
            "megarl_tp2_rmpad_vs_tp2": (runs["tp2_rmpad"], runs["tp2"]),
            "megarl_tp1_vs_hf_fp32": (runs["tp1"], hf32),
            "megarl_tp2_vs_hf_fp32": (runs["tp2"], hf32),
            "megarl_tp2_rmpad_vs_hf_fp32": (runs["tp2_rmpad"], hf32),
            "hf_bf16_vs_hf_fp32": (hf16, hf32),
            "megarl_tp2_vs_hf_bf16": (runs["tp2"], hf16),
        }
        results["pairs"] = {k: compare(a, b, mask) for k, (a, b) in pairs.items()}
        write_json(args.out, results)
        ref = results["reference"]
        print(
            f"\n# bf16 log-prob agreement ({ref['response_tokens']} response tokens; HF fp32 mean log-prob "
            f"{ref['hf_fp32_mean_log_prob']:.3f}, mean entropy {ref['hf_fp32_mean_entropy_nats']:.3f} nats)"
        )
        print(f"{'pair':<30} {'mean|d|':>9} {'p99|d|':>9} {'max|d|':>9}")
        for k, v in results["pairs"].items():
            print(f"{k:<30} {v['mean_abs']:9.5f} {v['p99_abs']:9.5f} {v['max_abs']:9.5f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
