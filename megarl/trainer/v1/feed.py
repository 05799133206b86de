"""Training prompts one at a time, in the data loader's order, for the async modes' admission.

The loader yields batches of ``data.train_batch_size`` prompts, epoch after epoch; admission takes
them a prompt at a time (verl's async modes submit prompt by prompt too). For a checkpoint the feed
says where a resumed run must start so that no admitted-but-untrained prompt is lost: the loader's
position before the batch holding the oldest such prompt, and how many prompts of that batch to skip.
"""

from __future__ import annotations

from typing import Any

from megarl.protocol import DataProto


class PromptFeed:
    """Prompts of ``loader`` (a ``megarl.data.sampler.RLDataLoader``) in order; ``take(k)`` admits ``k``
    of them, numbered by their position in the feed (the admission index)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._iter = iter(loader)
        self._batch: DataProto | None = None
        self._batch_start = 0  # feed position of the current batch's first prompt
        self._used = 0  # prompts of the current batch taken
        self.position = 0  # prompts taken so far
        self._starts: dict[int, dict[str, int]] = {}  # batch start (feed position) -> loader state before it
        self._skip = 0

    def load_state(self, state: dict[str, Any], position: int) -> None:
        """Resume: the loader at ``state["loader"]``, ``state["skip"]`` prompts of its next batch already
        trained; the next prompt is numbered ``position``."""
        self.loader.load_state_dict(state["loader"])
        self._iter = iter(self.loader)
        self._batch, self._skip, self.position = None, int(state["skip"]), position

    def _next_batch(self) -> None:
        before = self.loader.state_dict()
        batch = next(self._iter, None)
        if batch is None:  # the epoch ended: the loader moved to the next one
            self._iter = iter(self.loader)
            before = self.loader.state_dict()
            batch = next(self._iter, None)
            if batch is None:
                raise RuntimeError("the training data yields no batch (data.train_batch_size exceeds the data)")
        self._batch, self._batch_start = batch, self.position - self._skip
        self._used = self._skip
        self._starts[self._batch_start] = before
        self._skip = 0

    def take(self, k: int) -> DataProto | None:
        """The next ``k`` prompts as one batch (None for ``k = 0``)."""
        rows: list[DataProto] = []
        while k > 0:
            if self._batch is None or self._used == len(self._batch):
                self._next_batch()
            count = min(k, len(self._batch) - self._used)
            rows.append(self._batch[self._used: self._used + count])
            self._used += count
            self.position += count
            k -= count
        return DataProto.concat(rows) if rows else None

    def resume_state(self, oldest_untrained: int | None) -> dict[str, Any]:
        """Where a resumed run starts: the loader state before the batch holding admission index
        ``oldest_untrained`` (None: the next prompt) and how many of that batch's prompts to skip."""
        index = self.position if oldest_untrained is None else oldest_untrained
        starts = [s for s in self._starts if s <= index]
        if not starts:  # nothing fetched since the start (or the resume)
            return {"loader": self.loader.state_dict(), "skip": self._skip}
        start = max(starts)
        for old in [s for s in self._starts if s < start]:
            del self._starts[old]
        return {"loader": self._starts[start], "skip": index - start}
