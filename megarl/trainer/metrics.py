"""Per-step data metrics computed on the controller from the batch (verl's names)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from megarl.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values[mask.bool()]


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values, response/prompt lengths and clip ratio."""
    b = batch.batch
    mask = b["response_mask"]
    response_length = mask.sum(-1).float()
    max_response = mask.shape[-1]
    prompt_length = b["attention_mask"][:, :-max_response].sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    if "advantages" in b.keys():
        metrics.update(_stats("critic/advantages", _masked(b["advantages"], mask)))
    if "returns" in b.keys():
        metrics.update(_stats("critic/returns", _masked(b["returns"], mask)))
    if use_critic and "values" in b.keys():
        metrics.update(_stats("critic/values", _masked(b["values"], mask)))
        returns = _masked(b["returns"], mask)
        values = _masked(b["values"], mask)
        var = returns.var() if returns.numel() > 1 else torch.tensor(0.0)
        metrics["critic/vf_explained_var"] = (1.0 - (returns - values).var() / (var + 1e-5)).item() if returns.numel() > 1 else 0.0
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length == max_response).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    if "entropys" in b.keys():
        metrics["actor/entropy"] = (_masked(b["entropys"], mask).mean().item() if mask.any() else 0.0)
    return metrics


def num_tokens(batch: DataProto) -> int:
    """Valid prompt + response tokens of the batch."""
    return int(batch.batch["attention_mask"].sum().item())


def mean_metrics(dicts: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each numeric metric over the dicts the workers returned (one per rank or replica)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for d in dicts:
        for k, v in (d or {}).items():
            if isinstance(v, (int, float)):
                sums[k].append(float(v))
    return {k: float(np.mean(v)) for k, v in sums.items()}


def generation_metrics(per_replica: list[dict[str, float]]) -> dict[str, float]:
    """The replicas' generation metrics averaged, the engine time (``timing/generate_s``) as ``timing_s/gen_engine``
    (the mean) and ``timing_s/gen_engine_max`` (the slowest replica's, which the step waits for)."""
    metrics = mean_metrics(per_replica)
    times = [d["timing/generate_s"] for d in per_replica if d and "timing/generate_s" in d]
    if times:
        metrics["timing_s/gen_engine"] = metrics.pop("timing/generate_s")
        metrics["timing_s/gen_engine_max"] = max(times)
    return metrics
