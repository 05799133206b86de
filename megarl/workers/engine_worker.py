"""A standalone rollout engine (trainer.v1 separate_async): one vLLM engine on its own GPU that
generates continuously, while the trainer trains on other GPUs.

One thread owns the engine (it builds it, steps it, loads weights into it): it drives the
:class:`~megarl.workers.rollout_session.RolloutSession` of every group submitted here and, between
engine steps, runs the commands the Ray calls queue for it (the Ray actor is threaded, so a call
such as :meth:`EngineWorker.collect` is served while the engine generates):

* ``submit_groups`` / ``cancel_groups``: groups start / stop (evicted);
* ``collect``: the groups finished so far;
* ``receive_weights``: the weight push of policy version ``v``: every request in flight is interrupted
  (partial rollout), the trainer's rank 0 broadcasts the weights bucket by bucket over the weight-push
  group (megarl.weight_sync.sync_group; checksummed per bucket with ``weight_sync.integrity_check``),
  vLLM loads them in place (``reload_weights``), every tensor of the plan counted, and the interrupted
  requests continue under version ``v``;
* ``validate_sequences``: a validation batch, generated beside the training groups.

A sample that fails is reported by the next call (the run stops with its error).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.protocol import DataProto

COMMAND_TIMEOUT_S = 3600.0  # the longest a call waits for the engine thread (a weight push included)
_POLL_S = 0.02


class EngineWorker:
    """Args: the typed ``actor_rollout_ref`` section (``rollout.*``, ``model.path``); ``device``."""

    def __init__(self, config: ActorRolloutRefConfig, device: str | None = None) -> None:
        self.config = config
        self.device = device or "cpu"
        self.integrity_check = bool(config.rollout.weight_sync.integrity_check)
        self._commands: queue.Queue[tuple[Callable, tuple, Future]] = queue.Queue()
        self._wake = threading.Event()  # set when a command is queued
        self._stop = False
        self._failure: BaseException | None = None
        self._val_ids = itertools.count(-1, -1)  # validation groups: ids the trainer's sampler never uses
        self.rollout = None
        self.session = None
        self.push_group = None
        self.plan = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the engine thread
    def init_model(self) -> None:
        """Start the engine thread; it builds the engine (dummy weights until the first push)."""
        ready: Future = Future()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="megarl-engine", daemon=True)
        self._thread.start()
        ready.result()

    def _serve(self, ready: Future) -> None:
        from megarl.workers.rollout import RolloutWorker
        from megarl.workers.rollout_session import RolloutSession

        try:
            self.rollout = RolloutWorker(self.config, self.config.model.path, sleep_level=1)
            self.session = RolloutSession(self.rollout)
        except BaseException as exc:  # noqa: BLE001 - reported to init_model's caller
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while not self._stop:
            self._run_commands()
            if self._stop:
                break
            if self._failure is None and self.session.unfinished:
                try:
                    self.session.run_until(self.session.gids, len(self.session.gids),
                                           extra=lambda: not self._commands.empty())
                except Exception as exc:  # a sample failed: the next call reports it
                    self._failure = exc
            else:
                self._wait_for_command()
        self.session.close()
        self.rollout.shutdown()

    def _wait_for_command(self) -> None:
        self._wake.wait(timeout=0.5)
        self._wake.clear()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, args, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
                done.set_exception(exc)

    def _on_engine_thread(self, fn: Callable, *args: Any, timeout_s: float = COMMAND_TIMEOUT_S) -> Any:
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the engine thread is not running")
        done: Future = Future()
        self._commands.put((fn, args, done))
        self._wake.set()
        return done.result(timeout=timeout_s)

    def _check(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"rollout engine (pid {os.getpid()}): {self._failure}") from self._failure

    # ------------------------------------------------------------------ groups
    def submit_groups(self, prompts: DataProto, gids: list[int]) -> None:
        self._check()
        self._on_engine_thread(self.session.submit, prompts, gids)

    def cancel_groups(self, gids: list[int]) -> None:
        if gids:
            self._on_engine_thread(self.session.cancel, gids)

    def collect(self, wait_s: float) -> dict[str, Any]:
        """The training groups finished since the last call (waiting up to ``wait_s`` for one):
        ``{"groups": {gid: samples}, "metrics": {...}}``."""
        deadline = time.monotonic() + wait_s
        while True:
            self._check()
            groups, generating = self._on_engine_thread(lambda: (self.session.take_finished(), self.session.unfinished))
            if groups or time.monotonic() >= deadline:
                return {"groups": groups, "metrics": {"rollout/groups_generating": float(generating)}}
            time.sleep(_POLL_S)

    # ------------------------------------------------------------------ weights
    def pad_token_id(self) -> int:
        """The id the rollout pads responses with."""
        return self.rollout.pad_token_id

    def engine_dtype(self) -> str:
        """The engine's parameter dtype (the weight-push plan casts to it)."""
        return str(self.rollout.llm.llm_engine.model_config.dtype).replace("torch.", "")

    def join_weight_push(self, host: str, port: int, rank: int, size: int, backend: str, timeout_s: float, plan) -> None:
        """Join the weight-push group as ``rank`` (the trainer's rank 0 is rank 0) with the sender's plan."""
        from megarl.weight_sync.sync_group import SyncGroup

        self.plan = plan
        self.push_group = SyncGroup(host, port, rank, size, backend, timeout_s)

    def receive_weights(self, version: int) -> dict[str, float]:
        """Policy ``version`` from the trainer (the docstring's ``receive_weights``)."""
        self._check()
        return self._on_engine_thread(self._receive, version)

    def _receive(self, version: int) -> dict[str, float]:
        from megarl.weight_sync.transport import SyncStats, stream_broadcast

        interrupted = self.session.pause()
        stats = SyncStats()
        device = "cuda" if self.push_group.backend == "nccl" else "cpu"
        count = self.rollout.update_weights(stream_broadcast(None, self.plan, src=0, group=self.push_group, device=device,
                                                             integrity_check=self.integrity_check, stats=stats))
        if count != self.plan.num_tensors:
            raise RuntimeError(f"weight push of version {version}: {count} tensors loaded, the plan has {self.plan.num_tensors}")
        self.session.engine.version = version
        return {**stats.as_metrics("weight_push/"), "weight_push/interrupted_requests": float(interrupted)}

    # ------------------------------------------------------------------ validation
    def validate_sequences(self, prompts: DataProto, *, do_sample: bool) -> DataProto:
        """Like ``RolloutWorker.generate_sequences(validate=True)``, generated beside the training groups."""
        from megarl.agent.batch import trajectories_to_batch

        self._check()
        gids = [next(self._val_ids) for _ in range(len(prompts))]
        self._on_engine_thread(self.session.submit, prompts, gids, True)
        while True:
            self._check()
            groups = self._on_engine_thread(self.session.take, gids)
            if groups is not None:
                break
            time.sleep(_POLL_S)
        params = self.rollout.sampling_params(validate=True, do_sample=do_sample)
        samples = [s for gid in gids for s in groups[gid]]
        out = trajectories_to_batch(prompts, samples, params.n, params.max_tokens, self.rollout.pad_token_id,
                                    self.rollout.calculate_log_probs)
        out.meta_info = {**prompts.meta_info, **out.meta_info, "validate": True, "do_sample": params.temperature > 0,
                         "temperature": params.temperature if params.temperature > 0 else 1.0}
        return out

    def shutdown(self) -> None:
        self._stop = True
        if self._thread is not None:
            self._commands.put((lambda: None, (), Future()))
            self._wake.set()
            self._thread.join(timeout=120)
