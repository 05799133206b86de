"""Reward managers: decoded responses -> ``token_level_scores`` ``[B, R]``.

Every manager puts a response's score on its last valid token (0 elsewhere) and returns
``(token_level_scores, reward_extra_info)``, where ``reward_extra_info`` maps a name to a
list of length B (``score`` always; any extra keys a scorer returns in a dict).

* ``naive``: one ``fn(data_source, solution_str, ground_truth, extra_info)`` call per row.
* ``batch``: one ``fn(data_sources, solution_strs, ground_truths, extra_infos)`` call with
  lists, returning a list of scores.
* ``prime``: the per-row calls in a process pool with a timeout for the batch (rows not
  done by then score 0 and is counted in ``reward/timeouts``).
* ``dapo``: per-row scores plus DAPO's overlong penalty (``reward.reward_kwargs.overlong_buffer_cfg``).

A scorer that raises, or returns NaN/Inf, is reported with the row index and its data_source.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import time
from typing import Any, Callable

import numpy as np
import torch

from megarl.protocol import DataProto

REWARD_MANAGERS = ("naive", "batch", "prime", "dapo")
PRIME_TIMEOUT_S = 300.0  # for all rows of a batch
PRIME_WORKERS = 4


class RewardError(RuntimeError):
    """A scorer failed on a row; the message names the row and its data_source."""


def _ground_truth(row_reward_model: Any) -> Any:
    if isinstance(row_reward_model, dict):
        return row_reward_model.get("ground_truth")
    return row_reward_model


def decode_responses(data: DataProto, tokenizer: Any) -> list[str]:
    """Decoded valid response tokens of every row (special tokens skipped)."""
    responses = data.batch["responses"]
    lengths = data.batch["response_mask"].sum(-1).long().tolist()
    return [tokenizer.decode(responses[i, :n].tolist(), skip_special_tokens=True) for i, n in enumerate(lengths)]


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` scores -> ``[B, R]`` with each score on its row's last valid token.

    A row without response tokens gets its score at position 0 (so the signal is not lost).
    """
    lengths = response_mask.sum(-1).long()
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = torch.arange(len(lengths))
    out[rows, (lengths - 1).clamp(min=0)] = scores.to(torch.float32)
    return out


def _split_result(result: Any) -> tuple[float, dict[str, Any]]:
    """A scorer returns a number or a dict with ``score`` (+ extra per-row values)."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a reward function that returns a dict must include 'score', got keys {list(result)}")
        extra = {k: v for k, v in result.items() if k != "score"}
        return float(result["score"]), extra
    return float(result), {}


def _call_one(fn: Callable[..., Any], args: tuple) -> Any:
    return fn(*args)


class RewardManager:
    """Scores a rollout batch. Args: tokenizer (decodes responses), compute_score (the
    scorer; see ``megarl.reward.custom.load_reward_fn``), name (one of REWARD_MANAGERS),
    reward_fn_key (non-tensor column with the data source, ``data.reward_fn_key``),
    overlong (``(buffer_len, penalty_factor, max_response_length)`` for dapo, else None)."""

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any],
        name: str = "naive",
        reward_fn_key: str = "data_source",
        overlong: tuple[int, float, int] | None = None,
    ) -> None:
        if name not in REWARD_MANAGERS:
            raise ValueError(f"reward.reward_manager.name={name!r} is not one of {list(REWARD_MANAGERS)}")
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.name = name
        self.reward_fn_key = reward_fn_key
        self.overlong = overlong

    def _rows(self, data: DataProto) -> list[tuple]:
        n = len(data)
        nt = data.non_tensor_batch
        if self.reward_fn_key not in nt:
            raise KeyError(
                f"data.reward_fn_key={self.reward_fn_key!r}: the batch has no such column "
                f"(columns: {sorted(nt)})"
            )
        sources = nt[self.reward_fn_key]
        truths = nt.get("reward_model", np.array([None] * n, dtype=object))
        extras = nt.get("extra_info", np.array([None] * n, dtype=object))
        texts = decode_responses(data, self.tokenizer)
        return [(sources[i], texts[i], _ground_truth(truths[i]), extras[i]) for i in range(n)]

    def _fail(self, i: int, row: tuple, error: BaseException) -> RewardError:
        return RewardError(
            f"reward function failed on row {i} (data_source={row[0]!r}): {type(error).__name__}: {error}"
        )

    def _per_row(self, rows: list[tuple]) -> tuple[list[Any], int]:
        if self.name == "prime":
            return self._parallel(rows)
        results = []
        for i, row in enumerate(rows):
            try:
                results.append(self.compute_score(*row))
            except Exception as error:
                raise self._fail(i, row, error) from error
        return results, 0

    def _parallel(self, rows: list[tuple]) -> tuple[list[Any], int]:
        results: list[Any] = [0.0] * len(rows)
        timeouts = 0
        ctx = multiprocessing.get_context("fork")
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=PRIME_WORKERS, mp_context=ctx)
        try:
            futures = [pool.submit(_call_one, self.compute_score, row) for row in rows]
            deadline = time.monotonic() + PRIME_TIMEOUT_S  # rows run in parallel: one shared budget
            for i, future in enumerate(futures):
                try:
                    results[i] = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    timeouts += 1
                except Exception as error:
                    raise self._fail(i, rows[i], error) from error
        finally:
            # A hung scorer must not hold the step: kill the pool's processes instead of joining them.
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
        return results, timeouts

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """Returns token_level_scores ``[B, R]`` and reward_extra_info (lists of length B)."""
        rows = self._rows(data)
        timeouts = 0
        if self.name == "batch":
            columns = [list(c) for c in zip(*rows)] if rows else [[], [], [], []]
            try:
                results = list(self.compute_score(*columns))
            except Exception as error:
                raise RewardError(f"batch reward function failed: {type(error).__name__}: {error}") from error
            if len(results) != len(rows):
                raise RewardError(f"batch reward function returned {len(results)} scores for {len(rows)} rows")
        else:
            results, timeouts = self._per_row(rows)
        scores, extra = [], {}
        for i, result in enumerate(results):
            try:
                score, more = _split_result(result)
            except (TypeError, ValueError) as error:
                raise self._fail(i, rows[i], error) from error
            if not math.isfinite(score):
                raise self._fail(i, rows[i], ValueError(
                    f"score is {score}; a reward must be a finite number (fix the reward function, e.g. "
                    "reward.custom_reward_function.path, for this row)"))
            scores.append(score)
            for k, v in more.items():
                extra.setdefault(k, [None] * len(results))[i] = v
        score_t = torch.tensor(scores, dtype=torch.float32)
        mask = data.batch["response_mask"]
        token_level_scores = place_scores(score_t, mask)
        extra["score"] = scores
        if self.name == "dapo" and self.overlong is not None:
            from megarl.algorithms import apply_overlong_penalty

            buffer_len, factor, max_len = self.overlong
            token_level_scores, penalty = apply_overlong_penalty(token_level_scores, mask, max_len, buffer_len, factor)
            extra["overlong_penalty"] = penalty.tolist()
        if self.name == "prime":
            extra["timeouts"] = [timeouts] * len(rows)
        return token_level_scores, extra


def build_reward_manager(cfg: Any, tokenizer: Any) -> RewardManager:
    """The reward manager of a full config (reward.*, data.*)."""
    from megarl.config.schema_reward import overlong_buffer
    from megarl.reward.custom import load_reward_fn

    name = cfg.reward.reward_manager.name
    overlong = None
    buffer = overlong_buffer(dict(cfg.reward.reward_kwargs))
    if name == "dapo" and buffer is not None and buffer.enable:
        overlong = (buffer.len, float(buffer.penalty_factor), int(cfg.data.max_response_length))
    return RewardManager(
        tokenizer,
        load_reward_fn(cfg.reward.custom_reward_function),
        name=name,
        reward_fn_key=cfg.data.reward_fn_key,
        overlong=overlong,
    )
