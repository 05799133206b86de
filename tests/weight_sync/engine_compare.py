"""Shared helpers: Megatron layouts through the transport, and synced-vs-fresh engines."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from helpers.dist_utils import run_distributed
from sync_body import expected_hf_weights, sync_through_transport
from helpers.tiny_hf import actor_rollout_ref_config, left_padded_prompts

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


def make_worker(hf_dir: Path, load_format: str, **overrides):
    """``overrides``: more ``actor_rollout_ref`` keys (relative, e.g. ``{"rollout.dtype": "bfloat16"}``)."""
    from megarl.workers.rollout import RolloutWorker

    cfg = actor_rollout_ref_config(hf_dir, P, R, **{"rollout.load_format": load_format, "rollout.ignore_eos": True,
                                                    **overrides})
    return RolloutWorker(cfg, str(hf_dir))


def greedy(worker) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy responses ``[3, R]`` and their log-probs ``[3, R]``."""
    out = worker.generate_sequences(left_padded_prompts(PROMPTS, P), validate=False, do_sample=False)
    return out.batch["responses"], out.batch["rollout_log_probs"]


def assert_synced_engine_matches_export(src_dir: Path, captured: dict[str, torch.Tensor], expected_dir: Path,
                                        **overrides) -> None:
    """An engine loaded with dummy weights then given ``captured`` generates exactly (tokens and
    log-probs, greedy) what an engine loaded from ``expected_dir`` does (both with ``overrides``)."""
    synced = make_worker(src_dir, "dummy", **overrides)
    try:
        synced.update_weights(iter(captured.items()))
        tokens, log_probs = greedy(synced)
    finally:
        synced.shutdown()
    reference = make_worker(expected_dir, "auto", **overrides)
    try:
        ref_tokens, ref_log_probs = greedy(reference)
    finally:
        reference.shutdown()
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(log_probs, ref_log_probs)
