"""Generation that outlives a call: the async trainer modes' groups on one replica.

A :class:`RolloutSession` keeps the agent-loop tasks of every group submitted to its replica on its
own event loop, across calls: :meth:`submit` creates them, :meth:`run_until` steps the engine (the
:class:`~megarl.workers.resumable_engine.ResumableEngine`) until enough groups finished,
:meth:`pause` interrupts what is still generating (partial rollout: it resumes at the next
:meth:`run_until`, under whatever weights the engine holds then), :meth:`take_finished` hands the
finished groups over. Between calls the loop does not run; the tasks wait where they were (tool
threads keep running).

The tasks of a submit are created in row order and start when the engine next runs, as
``AsyncEngine.run`` starts a batch's coroutines: with nothing else in flight a session generates
exactly what ``generate_sequences`` generates on the same prompts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

from megarl.agent.base import AgentContext, AgentLoopOutput
from megarl.protocol import DataProto, to_object_array
from megarl.workers.async_engine import sample_with_versions
from megarl.workers.resumable_engine import ResumableEngine


class RolloutSession:
    """The groups of one replica (``rollout``: its :class:`~megarl.workers.rollout.RolloutWorker`,
    ``rollout.mode=async``; at rollout TP > 1 this runs on the replica's leader only)."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.loop = asyncio.new_event_loop()
        self.engine = ResumableEngine(rollout.leader_engine or rollout.llm.llm_engine)
        self._contexts: dict[bool, AgentContext] = {}
        self._n: dict[bool, int] = {}  # samples per prompt (rollout.n / val_kwargs.n)
        self._loops: dict[tuple[str, bool], Any] = {}  # agent loop instances per (name, validate)
        self._tasks: dict[int, list[asyncio.Task]] = {}  # gid -> the group's sample tasks
        self._left: dict[int, int] = {}  # gid -> its tasks not done yet (kept by their done-callbacks)
        self._failed: BaseException | None = None  # the first sample that raised
        self._validation: set[int] = set()  # gids submitted with validate=True

    def _context(self, validate: bool) -> AgentContext:
        if validate not in self._contexts:
            params = self.rollout.sampling_params(validate=validate, do_sample=True)
            one = params.clone()
            one.n = 1
            r = self.rollout
            self._contexts[validate] = AgentContext(engine=self.engine, rollout=r.rollout_cfg, tokenizer=r.tokenizer,
                                                    sampling_params=one, pad_token_id=r.pad_token_id,
                                                    eos_token_ids=r.eos_token_ids)
            self._n[validate] = params.n
        return self._contexts[validate]

    def _agent_loop(self, name: str, validate: bool, row: int) -> Any:
        """This session's own instance (its context never changes under a suspended sample)."""
        if name not in self.rollout.agents:
            raise ValueError(f"prompt row {row}: agent_name {name!r} is not an agent loop ({sorted(self.rollout.agents)}; "
                             "add it with actor_rollout_ref.rollout.agent.agent_loop_config_path)")
        key = (name, validate)
        if key not in self._loops:
            self._loops[key] = self.rollout.agents[name](self._context(validate))
        return self._loops[key]

    def submit(self, prompts: DataProto, gids: list[int], validate: bool = False) -> None:
        """Groups ``gids[i]`` = ``rollout.n`` samples of prompt row ``i`` (left-padded ``input_ids`` /
        ``attention_mask``, non-tensor columns); they start at the next :meth:`run_until`."""
        self._context(validate)
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        columns = {k: to_object_array(v) for k, v in prompts.non_tensor_batch.items()}
        names = columns.get("agent_name", [self.rollout.default_agent_loop] * len(gids))
        for i, gid in enumerate(gids):
            tokens = ids[i][mask[i].bool()].tolist()
            if not tokens:
                raise ValueError(f"prompt row {i} has no tokens (attention_mask all zero)")
            loop = self._agent_loop(str(names[i]), validate, i)
            sample = {k: v[i] for k, v in columns.items()}
            self._tasks[gid] = [self.loop.create_task(sample_with_versions(loop.run(tokens, sample)))
                                for _ in range(self._n[validate])]
            self._left[gid] = len(self._tasks[gid])
            for task in self._tasks[gid]:
                task.add_done_callback(lambda t, gid=gid: self._task_done(gid, t))
            if validate:
                self._validation.add(gid)

    def _task_done(self, gid: int, task: asyncio.Task) -> None:
        if gid in self._left:
            self._left[gid] -= 1
        if not task.cancelled() and task.exception() is not None and self._failed is None:
            error = task.exception()
            self._failed = RuntimeError(f"group {gid}: an agent loop failed: {type(error).__name__}: {error}")

    def _done(self, gid: int) -> bool:
        return self._left.get(gid, 0) == 0

    def run_until(self, gids: Collection[int], count: int, extra: Callable[[], bool] | None = None) -> None:
        """Step the engine until ``count`` of ``gids`` are finished (groups no longer here count as
        finished), every one of them is, a sample failed (raised here), or ``extra()`` is true."""
        gids = list(gids)

        def done() -> bool:
            finished = sum(self._done(g) for g in gids)
            return (finished >= count or finished == len(gids) or self._failed is not None
                    or (extra is not None and extra()))

        if not done():
            self.engine.resume()
            self.loop.run_until_complete(self.engine.drive(done))
        if self._failed is not None:
            raise self._failed

    def pause(self) -> int:
        """Interrupt every request in flight (partial rollout); returns how many."""
        return self.engine.pause()

    def _pop(self, gids: Collection[int]) -> dict[int, list[AgentLoopOutput]]:
        out = {gid: [t.result() for t in self._tasks.pop(gid)] for gid in gids}
        for gid in gids:
            del self._left[gid]
        self._validation.difference_update(gids)
        return out

    def take_finished(self) -> dict[int, list[AgentLoopOutput]]:
        """The finished training groups' samples (gid -> ``rollout.n`` trajectories), removed from the session."""
        return self._pop([gid for gid in self._tasks if gid not in self._validation and self._done(gid)])

    def take(self, gids: Collection[int]) -> dict[int, list[AgentLoopOutput]] | None:
        """These groups' samples once every one of them finished (removed then), else None."""
        return self._pop(gids) if all(self._done(g) for g in gids) else None

    @property
    def gids(self) -> list[int]:
        """Groups submitted and not handed over yet."""
        return list(self._tasks)

    @property
    def unfinished(self) -> int:
        """Groups still generating (or waiting to resume)."""
        return sum(left > 0 for left in self._left.values())

    def cancel(self, gids: Collection[int]) -> None:
        """Drop these groups (evicted): their tasks are cancelled and their requests aborted."""
        tasks = [t for gid in gids for t in self._tasks.pop(gid, [])]
        for gid in gids:
            self._left.pop(gid, None)
        for task in tasks:
            task.cancel()
        if tasks and not self.loop.is_running():
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def close(self) -> None:
        self.cancel(list(self._tasks))
        self.loop.close()
