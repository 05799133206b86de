"""Reward managers: decoded responses -> ``token_level_scores`` ``[B, R]``.

Every manager puts a response's score on its last valid token (0 elsewhere) and returns
``(token_level_scores, reward_extra_info)``, where ``reward_extra_info`` maps a name to a
list of length B (``score`` and ``timeout`` always; any extra keys a scorer returns in a dict).

* ``naive`` and ``prime``: one ``fn(data_source, solution_str, ground_truth, extra_info)`` call per row.
* ``batch``: one ``fn(data_sources, solution_strs, ground_truths, extra_infos)`` call with
  lists, returning a list of scores.
* ``dapo``: per-row scores plus DAPO's overlong penalty (``reward.reward_kwargs.overlong_buffer_cfg``).

Every call runs in a child process (megarl.reward.scoring_pool), the per-row calls
``reward.num_workers`` at once, each bounded by ``reward.timeout`` seconds: a call past it is
killed and its sample scores ``TIMEOUT_SCORE`` = 0.0 (verl's rule), ``reward_extra_info["timeout"]``
is 1.0 for it (the trainer logs the count as ``reward/timeouts``), and the first one is printed
with the sample. For ``batch`` the one call covers the whole batch: a timeout scores every row 0.0.
A batch's scoring as a whole is bounded by ``reward.phase_timeout`` (each row counted from when
its response was ready): rows not scored by then stop the run with a ``RewardError`` naming them,
or with ``trainer.nan_policy=skip`` score ``TIMEOUT_SCORE`` (counted as timeouts) with a warning
naming them.

A score must be a real number (int, float, numpy number; not bool, str or tensor) or a dict
with such a ``score``, finite once converted to float32 (``SCORE_DTYPE``: 1e300 is not). A
scorer that raises, returns anything else, or a non-finite score raises ``RewardError`` naming
training / validation, the step, the row and its data_source, the scorer, prompt, ground truth
and response; the scorer's traceback is kept in ``scorer_traceback``.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from megarl.config.read import to_dict
from megarl.config.schema.reward import overlong_buffer
from megarl.protocol import DataProto
from megarl.reward.custom import describe_scorer
from megarl.reward.scoring_pool import Outcome, ScoringPool

if TYPE_CHECKING:
    from megarl.config.schema.root import MegaRLConfig

REWARD_MANAGERS = ("naive", "batch", "prime", "dapo")
TIMEOUT_SCORE = 0.0
SCORE_DTYPE = torch.float32  # of token_level_scores (place_scores)
_SHOWN_CHARS = 200  # of a prompt / response in messages


class RewardError(RuntimeError):
    """A scorer failed on a row; the message names where (training / validation, step) and the
    sample. ``scorer_traceback``: the scorer's own traceback (for the failure log), or ""."""

    def __init__(self, message: str, scorer_traceback: str = "") -> None:
        super().__init__(message)
        self.scorer_traceback = scorer_traceback


def _ground_truth(row_reward_model: Any) -> Any:
    if isinstance(row_reward_model, dict):
        return row_reward_model.get("ground_truth")
    return row_reward_model


def decode_responses(data: DataProto, tokenizer: Any) -> list[str]:
    """Decoded response tokens of every row (special tokens skipped): the whole trajectory, tool
    observations included (the response part of ``attention_mask``; ``response_mask`` without it)."""
    responses = data.batch["responses"]
    if "attention_mask" in data.batch.keys():
        lengths = data.batch["attention_mask"][:, -responses.shape[1]:].sum(-1).long().tolist()
    else:
        lengths = data.batch["response_mask"].sum(-1).long().tolist()
    return [tokenizer.decode(responses[i, :n].tolist(), skip_special_tokens=True) for i, n in enumerate(lengths)]


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` scores -> ``[B, R]`` with each score on its row's last model token (the last 1 of
    ``response_mask``: multi-turn rows have observation holes).

    A row without response tokens gets its score at position 0 (so the signal is not lost).
    """
    positions = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    last = ((response_mask > 0).long() * positions).argmax(-1)
    out = torch.zeros(response_mask.shape, dtype=SCORE_DTYPE)
    out[torch.arange(len(last)), last] = scores.to(SCORE_DTYPE)
    return out


def _number(value: Any) -> float:
    """``value`` as a float when it is a real number; TypeError otherwise (no coercion of
    "1.0", True or tensors: a reward function returning those has a bug)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"returned {value!r} ({type(value).__name__}); a reward must be a real number (int or float), "
                        "or a dict whose 'score' is one")
    return float(value)


def _split_result(result: Any) -> tuple[float, dict[str, Any]]:
    """A scorer returns a number or a dict with ``score`` (+ extra per-row values)."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a reward function that returns a dict must include 'score', got keys {list(result)}")
        extra = {k: v for k, v in result.items() if k != "score"}
        return _number(result["score"]), extra
    return _number(result), {}


def _shown(value: Any) -> str:
    """repr of ``value`` for a message, a long string cut to _SHOWN_CHARS."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return repr(value[:_SHOWN_CHARS]) + f"...(+{len(value) - _SHOWN_CHARS} chars)"
    text = repr(value)
    return text if len(text) <= 2 * _SHOWN_CHARS else text[: 2 * _SHOWN_CHARS] + "..."


class RewardManager:
    """Scores a rollout batch. Args: tokenizer (decodes prompts and responses), compute_score
    (the scorer; see ``megarl.reward.custom.load_reward_fn``), name (one of REWARD_MANAGERS),
    timeout_s (``reward.timeout``: seconds per scoring call), reward_fn_key (non-tensor column
    with the data source, ``data.reward_fn_key``), overlong (``(buffer_len, penalty_factor,
    max_response_length)`` for dapo, else None), processes (``reward.num_workers``: calls at once),
    phase_timeout_s (``reward.phase_timeout``: seconds a batch's scoring may take; None: 2 x
    timeout_s), skip_unscored (``trainer.nan_policy=skip``: rows not scored by then score 0.0 instead
    of stopping the run). ``close()`` stops the scoring processes."""

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any],
        name: str = "naive",
        *,
        timeout_s: float,
        reward_fn_key: str = "data_source",
        overlong: tuple[int, float, int] | None = None,
        processes: int = 1,
        phase_timeout_s: float | None = None,
        skip_unscored: bool = False,
    ) -> None:
        if name not in REWARD_MANAGERS:
            raise ValueError(f"reward.reward_manager.name={name!r} is not one of {list(REWARD_MANAGERS)}")
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.name = name
        self.timeout_s = float(timeout_s)
        self.reward_fn_key = reward_fn_key
        self.overlong = overlong
        self.scorer = describe_scorer(compute_score)
        self.phase_timeout_s = 2 * self.timeout_s if phase_timeout_s is None else float(phase_timeout_s)
        self.skip_unscored = skip_unscored
        self.pool = ScoringPool(compute_score, 1 if name == "batch" else processes, self.timeout_s)
        self._timeout_reported = False

    def start(self) -> None:
        """Start the scoring processes now (the trainer does, before Ray starts its threads)."""
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

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

    def _prompt(self, data: DataProto, i: int) -> str | None:
        if "prompts" not in data.batch.keys():
            return None
        ids = data.batch["prompts"][i]
        if "attention_mask" in data.batch.keys():
            ids = ids[data.batch["attention_mask"][i, : ids.shape[0]].bool()]
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def _sample(self, data: DataProto, i: int, row: tuple) -> str:
        """Where (training / validation, step) and what (row, data_source, prompt, truth, response)."""
        phase = "validation" if data.meta_info.get("validate", False) else "training"
        step = data.meta_info.get("global_step")
        at = phase if step is None else f"{phase} at step {step}"
        prompt = self._prompt(data, i)
        shown = "" if prompt is None else f"prompt={_shown(prompt)}, "
        return f"row {i} (data_source={row[0]!r}, scorer {self.scorer}) in {at}; sample: {shown}ground_truth={_shown(row[2])}, response={_shown(row[1])}"

    def _fail(self, data: DataProto, i: int, row: tuple, problem: str, scorer_traceback: str = "") -> RewardError:
        return RewardError(f"reward function failed on {self._sample(data, i, row)}: {problem}", scorer_traceback)

    def _report_timeout(self, data: DataProto, i: int, row: tuple) -> None:
        if self._timeout_reported:
            return
        self._timeout_reported = True
        print(f"[megarl] WARNING: reward.timeout={self.timeout_s:g} s: the reward function did not return on "
              f"{self._sample(data, i, row)}; the call was killed and the sample scores {TIMEOUT_SCORE}. Later "
              "timeouts are only counted (metric reward/timeouts).", flush=True)

    def _outcomes(self, data: DataProto, rows: list[tuple]) -> list[Outcome]:
        """One Outcome per row; for ``batch`` the one call's result split per row."""
        deadline = time.monotonic() + self.phase_timeout_s
        if self.name != "batch":
            return self.pool.run(rows, deadline)
        columns = tuple(list(c) for c in zip(*rows)) if rows else ([], [], [], [])
        (outcome,) = self.pool.run([columns], deadline)
        if outcome.kind in ("timeout", "pending"):
            return [outcome] * len(rows)
        if outcome.kind == "error":
            raise RewardError(f"batch reward function failed on the batch of {len(rows)} rows (first: "
                              f"{self._sample(data, 0, rows[0]) if rows else 'none'}): {outcome.error_type}: "
                              f"{outcome.error_text}", outcome.traceback)
        try:
            results = list(outcome.value)
        except TypeError:
            raise RewardError(f"batch reward function returned {type(outcome.value).__name__}, not a list of scores") from None
        if len(results) != len(rows):
            raise RewardError(f"batch reward function returned {len(results)} scores for {len(rows)} rows")
        return [Outcome("ok", value=r) for r in results]

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """Returns token_level_scores ``[B, R]`` and reward_extra_info (lists of length B)."""
        rows = self._rows(data)
        return self.collect(data, rows, self._outcomes(data, rows))

    def row(self, data_source: Any, response_text: str, reward_model: Any, extra_info: Any) -> tuple:
        """One sample's scoring call arguments (as ``__call__`` builds them from a batch)."""
        return (data_source, response_text, _ground_truth(reward_model), extra_info)

    def score_row(self, row: tuple, ready_at: float) -> Outcome:
        """One per-row scoring call, bounded by ``phase_timeout_s`` from ``ready_at`` (the
        ``time.monotonic()`` its response was complete); not for ``batch``, whose one call covers the
        whole batch."""
        if self.name == "batch":
            raise ValueError("reward_manager 'batch' scores a whole batch in one call, not row by row")
        (outcome,) = self.pool.run([row], ready_at + self.phase_timeout_s)
        return outcome

    def _unscored(self, data: DataProto, rows: list[tuple], pending: list[int]) -> None:
        """Rows ``reward.phase_timeout`` ran out on: a RewardError naming them, or (``skip_unscored``) a
        warning naming them (they score TIMEOUT_SCORE, counted as timeouts)."""
        if not pending:
            return
        shown = ", ".join(f"{i} ({rows[i][0]})" for i in pending[:10]) + (f", ... ({len(pending) - 10} more)" if len(pending) > 10 else "")
        what = (f"reward.phase_timeout={self.phase_timeout_s:g} s (reward.timeout={self.timeout_s:g} s a call, "
                f"{self.pool.processes} at once: reward.num_workers): {len(pending)} of {len(rows)} rows were not "
                f"scored in time: rows {shown}; first: {self._sample(data, pending[0], rows[pending[0]])}")
        if not self.skip_unscored:
            raise RewardError(f"{what}. Make the reward function faster or raise reward.phase_timeout / "
                              "reward.num_workers; trainer.nan_policy=skip scores such rows 0.0 and goes on")
        print(f"[megarl] WARNING: {what}; they score {TIMEOUT_SCORE} (trainer.nan_policy=skip; counted in "
              "reward/timeouts)", flush=True)

    def collect(self, data: DataProto, rows: list[tuple], outcomes: list[Outcome]) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """token_level_scores ``[B, R]`` and reward_extra_info from each row's Outcome (errors raise
        RewardError naming the row; timeouts score TIMEOUT_SCORE; rows still pending at the phase's
        end: see :meth:`_unscored`; dapo's overlong penalty)."""
        self._unscored(data, rows, [i for i, outcome in enumerate(outcomes) if outcome.kind == "pending"])
        scores, timeouts, extra = [], [], {}
        for i, outcome in enumerate(outcomes):
            if outcome.kind in ("timeout", "pending"):
                if outcome.kind == "timeout":
                    self._report_timeout(data, i, rows[i])
                scores.append(TIMEOUT_SCORE)
                timeouts.append(1.0)
                continue
            if outcome.kind == "error":
                raise self._fail(data, i, rows[i], f"{outcome.error_type}: {outcome.error_text}", outcome.traceback)
            try:
                score, more = _split_result(outcome.value)
            except (TypeError, ValueError) as error:
                raise self._fail(data, i, rows[i], str(error)) from None
            if not math.isfinite(score):
                raise self._fail(data, i, rows[i], f"score is {score}; a reward must be a finite number (fix the reward "
                                                   "function, e.g. reward.custom_reward_function.path, for this row)")
            scores.append(score)
            timeouts.append(0.0)
            for k, v in more.items():
                extra.setdefault(k, [None] * len(rows))[i] = v
        score_t = torch.tensor(scores, dtype=SCORE_DTYPE)
        for i in (~torch.isfinite(score_t)).nonzero().flatten().tolist():  # e.g. 1e300: finite as a float, inf as float32
            raise self._fail(data, i, rows[i], f"score {scores[i]!r} is {score_t[i].item()} as {SCORE_DTYPE} (the dtype "
                                               f"of token_level_scores); a reward must be a finite number within "
                                               f"+-{torch.finfo(SCORE_DTYPE).max:.4g} (fix the reward function for this row)")
        mask = data.batch["response_mask"]
        token_level_scores = place_scores(score_t, mask)
        extra["score"] = scores
        extra["timeout"] = timeouts
        if self.name == "dapo" and self.overlong is not None:
            from megarl.algorithms import apply_overlong_penalty

            buffer_len, factor, max_len = self.overlong
            token_level_scores, penalty = apply_overlong_penalty(token_level_scores, mask, max_len, buffer_len, factor)
            extra["overlong_penalty"] = penalty.tolist()
        return token_level_scores, extra


@dataclass(frozen=True)
class RewardSpec:
    """What a reward manager is built from, picklable: the driver builds one from the config, and with
    streamed scoring (``reward.launch_reward_fn_async`` in ``rollout.mode=async``) each rollout worker
    builds its own from the same spec (megarl.reward.streaming). ``custom_fn``: the plain mapping of
    ``reward.custom_reward_function``; ``overlong``: see :class:`RewardManager`."""

    name: str
    timeout_s: float
    reward_fn_key: str
    custom_fn: dict[str, Any]
    overlong: tuple[int, float, int] | None
    processes: int  # reward.num_workers
    phase_timeout_s: float  # reward.phase_timeout (resolved)
    skip_unscored: bool  # trainer.nan_policy == "skip"


def reward_spec(cfg: MegaRLConfig) -> RewardSpec:
    """The reward spec of the run's config (reward.*, data.*)."""
    name = cfg.reward.reward_manager.name
    overlong = None
    buffer = overlong_buffer(cfg.reward.reward_kwargs)
    if name == "dapo" and buffer is not None and buffer.enable:
        overlong = (buffer.len, float(buffer.penalty_factor), int(cfg.data.max_response_length))
    custom = to_dict(cfg.reward.custom_reward_function)
    return RewardSpec(name, float(cfg.reward.timeout), cfg.data.reward_fn_key, custom, overlong,
                      cfg.reward.num_workers, cfg.reward.phase_timeout_s(), cfg.trainer.nan_policy == "skip")


def make_reward_manager(spec: RewardSpec, tokenizer: Any) -> RewardManager:
    from megarl.reward.custom import load_reward_fn

    return RewardManager(tokenizer, load_reward_fn(spec.custom_fn), name=spec.name, timeout_s=spec.timeout_s,
                         reward_fn_key=spec.reward_fn_key, overlong=spec.overlong, processes=spec.processes,
                         phase_timeout_s=spec.phase_timeout_s, skip_unscored=spec.skip_unscored)


def build_reward_manager(cfg: MegaRLConfig, tokenizer: Any) -> RewardManager:
    """The reward manager of the run's config (reward.*, data.*)."""
    return make_reward_manager(reward_spec(cfg), tokenizer)
