"""Shared helpers: Megatron layouts through the transport, and synced-vs-fresh engines."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from dist_utils import run_distributed
from sync_body import expected_hf_weights, sync_through_transport
from tiny_hf import actor_rollout_ref_config

PROMPTS = [[5, 6, 7], [11, 12, 13, 14, 15], [40, 41, 42, 43, 44, 45, 46, 47]]
P, R = 8, 6


def run_layout(hf_dir, world, megatron_cfg, scale, shift, transport="in_process", bucket_bytes=150_000):
    return run_distributed(sync_through_transport, world, megatron_cfg, str(hf_dir), scale, shift,
                           bucket_bytes, transport, timeout=300)


def write_expected(hf_dir: Path, out_dir: Path, scale: float, shift: float) -> Path:
    """The HF checkpoint with the same elementwise change: what vLLM must receive."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(hf_dir / name, out_dir / name)
    save_file(expected_hf_weights(str(hf_dir), scale, shift), str(out_dir / "model.safetensors"))
    return out_dir


def make_worker(hf_dir: Path, load_format: str):
    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(hf_dir, P, R, **{"rollout.load_format": load_format, "rollout.ignore_eos": True})
    return RolloutWorker(cfg, str(hf_dir))


def greedy(worker) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy responses ``[3, R]`` and their log-probs ``[3, R]``."""
    from megarl.protocol import DataProto

    ids = torch.zeros((len(PROMPTS), P), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(PROMPTS):
        ids[i, P - len(row):] = torch.tensor(row)
        mask[i, P - len(row):] = 1
    data = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                               )
    out = worker.generate_sequences(data, validate=False, do_sample=False)
    return out.batch["responses"], out.batch["rollout_log_probs"]
