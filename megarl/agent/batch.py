"""Agent-loop trajectories -> the rollout's DataProto (the layout of the batched rollout)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from megarl.agent.base import AgentLoopOutput


def trajectories_to_batch(prompts: Any, outputs: list[AgentLoopOutput], n: int, response_length: int,
                          pad_token_id: int, with_log_probs: bool, route_shape: tuple[int, int] | None = None) -> Any:
    """``outputs[i * n + j]`` is sample ``j`` of prompt row ``i`` of ``prompts``.

    Returns a DataProto of ``B * n`` rows: ``prompts`` ``[B*n, P]`` (the input rows, left-padded),
    ``responses`` / ``response_mask`` / ``rollout_log_probs`` ``[B*n, R]`` right-padded with the pad
    id / 0 / 0.0 (responses longer than R are cut), ``input_ids`` / ``attention_mask`` /
    ``position_ids`` ``[B*n, P+R]``; ``rollout_versions`` ``[B*n, R]`` int64, the policy version of each
    model token (-1 on observations and padding), when every output reports its versions;
    non-tensor columns repeated per sample plus ``__num_turns__``
    and each loop's ``extra`` columns; meta_info ``metrics``: ``agent/num_turns/{mean,max,min}`` and
    the mean of each per-sample metric over the samples that report it. With ``route_shape`` (MoE layers,
    top-k; the rollout recorded routes): ``routed_experts`` ``[B*n, P+R, MoE layers, top-k]`` int16 aligned
    with ``input_ids``, -1 where vLLM computed no route (padding, each sample's last token) and the metric
    ``rollout/routed_experts_missing_frac`` (the share of positions vLLM computed that came back without one).
    """
    from megarl.protocol import DataProto, to_object_array

    input_ids = prompts.batch["input_ids"]
    attention_mask = prompts.batch["attention_mask"]
    position_ids = prompts.batch["position_ids"]
    rows = len(outputs)
    responses = torch.full((rows, response_length), pad_token_id, dtype=input_ids.dtype)
    response_mask = torch.zeros((rows, response_length), dtype=attention_mask.dtype)
    log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    with_versions = all(out.response_versions is not None for out in outputs)
    versions = torch.full((rows, response_length), -1, dtype=torch.int64)
    for row, out in enumerate(outputs):
        if not len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs):
            raise ValueError(f"agent loop output {row}: response_ids, response_mask and response_logprobs differ in length")
        length = min(len(out.response_ids), response_length)
        responses[row, :length] = torch.tensor(out.response_ids[:length], dtype=input_ids.dtype)
        response_mask[row, :length] = torch.tensor(out.response_mask[:length], dtype=attention_mask.dtype)
        log_probs[row, :length] = torch.tensor(out.response_logprobs[:length], dtype=torch.float32)
        if with_versions:
            if len(out.response_versions) != len(out.response_ids):
                raise ValueError(f"agent loop output {row}: response_versions and response_ids differ in length")
            versions[row, :length] = torch.tensor(out.response_versions[:length], dtype=torch.int64)
    # every response token is attended (observations included); response_mask says which are trained
    lengths = torch.tensor([min(len(o.response_ids), response_length) for o in outputs])
    response_attn = (torch.arange(response_length)[None, :] < lengths[:, None]).to(attention_mask.dtype)

    prompt_ids = input_ids.repeat_interleave(n, dim=0)
    prompt_mask = attention_mask.repeat_interleave(n, dim=0)
    prompt_pos = position_ids.repeat_interleave(n, dim=0)
    delta = torch.arange(1, response_length + 1, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[:, -1:] + delta.unsqueeze(0)

    index = np.repeat(np.arange(len(input_ids)), n)
    non_tensors = {key: to_object_array(value)[index] for key, value in prompts.non_tensor_batch.items()}
    non_tensors["__num_turns__"] = np.array([o.num_turns for o in outputs], dtype=np.int64)
    for key in sorted({k for o in outputs for k in o.extra}):
        non_tensors[key] = to_object_array([o.extra.get(key) for o in outputs])

    routes = {}
    if route_shape is not None:
        routes["routed_experts"], missing = _place_routes(outputs, input_ids.shape[1], response_length, route_shape)
    turns = non_tensors["__num_turns__"].astype(float)
    metrics = {"agent/num_turns/mean": float(turns.mean()), "agent/num_turns/max": float(turns.max()),
               "agent/num_turns/min": float(turns.min())}
    per_sample: dict[str, list[float]] = defaultdict(list)
    for out in outputs:
        for key, value in out.metrics.items():
            per_sample[key].append(value)
    metrics.update({key: float(np.mean(values)) for key, values in per_sample.items()})
    if routes:
        metrics["rollout/routed_experts_missing_frac"] = missing
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_attn], dim=1),
            "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
            **({"rollout_log_probs": log_probs} if with_log_probs else {}),
            **routes,
            **({"rollout_versions": versions} if with_versions else {}),
        },
        non_tensors=non_tensors,
        meta_info={"metrics": metrics},
    )


def _place_routes(outputs: list[AgentLoopOutput], prompt_length: int, response_length: int,
                  shape: tuple[int, int]) -> tuple[torch.Tensor, float]:
    """``routed_experts`` ``[rows, P+R, *shape]`` int16 laid out as ``input_ids`` (prompt left-padded into the first
    P columns, response from column P, cut at R), -1 elsewhere; and the share of the positions vLLM computed
    (all but each sample's last token) that have no route."""
    out = torch.full((len(outputs), prompt_length + response_length, *shape), -1, dtype=torch.int16)
    computed = missing = 0
    for row, sample in enumerate(outputs):
        start = prompt_length - len(sample.prompt_ids)
        length = min(len(sample.prompt_ids) + len(sample.response_ids) - 1, prompt_length + response_length - start)
        rows = np.full((length, *shape), -1, dtype=np.int16)
        if sample.routed_experts is not None:
            known = min(length, len(sample.routed_experts))
            rows[:known] = sample.routed_experts[:known]
        out[row, start: start + length] = torch.from_numpy(rows)
        computed += length
        missing += int((rows < 0).any(axis=(1, 2)).sum())
    return out, missing / max(computed, 1)
