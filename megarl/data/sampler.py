"""A resumable, seeded sampler and the batch loader built on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from megarl.protocol import DataProto

if TYPE_CHECKING:
    from megarl.config.schema.data import DataConfig


def data_seed(data_cfg: DataConfig) -> int:
    """``data.seed`` of the data config; null = 1. Always a fixed seed: the preflight and the
    trainer build the loaders separately and must pick the same rows in the same order."""
    return 1 if data_cfg.seed is None else int(data_cfg.seed)


class ResumableSampler:
    """Dataset indices, epoch after epoch, with a state that says where it stands.

    Epoch ``e`` visits ``range(num_samples)`` in order, or (``shuffle``) in the permutation
    drawn from ``torch.Generator().manual_seed(seed + e)``. ``state_dict()`` is
    ``{"epoch", "position"}`` (indices already handed out in that epoch); a sampler
    loaded with it hands out exactly the indices the original had not.
    """

    def __init__(self, num_samples: int, shuffle: bool, seed: int):
        if num_samples <= 0:
            raise ValueError(f"ResumableSampler needs a non-empty dataset, got {num_samples} samples")
        self.num_samples, self.shuffle, self.seed = num_samples, shuffle, seed
        self.epoch = 0
        self.position = 0

    def epoch_order(self, epoch: int) -> list[int]:
        """All indices in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def take(self, count: int) -> list[int]:
        """Up to ``count`` next indices of the current epoch (fewer at its end, none when done)."""
        order = self.epoch_order(self.epoch)
        taken = order[self.position : self.position + count]
        self.position += len(taken)
        return taken

    def remaining(self) -> int:
        return self.num_samples - self.position

    def next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if not 0 <= state["position"] <= self.num_samples:
            raise ValueError(
                f"sampler state position {state['position']} out of range for a dataset of {self.num_samples} rows"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class ClassSampler(ResumableSampler):
    """A user's ``torch.utils.data.Sampler`` (``data.sampler``) behind the resumable interface.

    Epoch ``e`` visits the indices ``iter(sampler)`` yields (after ``sampler.set_epoch(e)``
    when it has one), read once per epoch. Resuming re-reads epoch ``e``'s order and skips
    the indices already handed out, so it continues exactly where it stopped when the
    sampler's order depends only on its constructor arguments and the epoch.
    """

    def __init__(self, sampler: Any, num_samples: int, name: str | None = None):
        super().__init__(num_samples, shuffle=False, seed=0)
        self.sampler, self.name = sampler, name or type(sampler).__name__
        self._order: tuple[int, list[int]] | None = None

    def epoch_order(self, epoch: int) -> list[int]:
        if self._order is not None and self._order[0] == epoch:
            return self._order[1]
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        order = [int(i) for i in iter(self.sampler)]
        bad = [i for i in order if not 0 <= i < self.num_samples]
        if not order or bad:
            from megarl.data.errors import DataError

            what = "no indices" if not order else f"index {bad[0]} outside the dataset of {self.num_samples} rows"
            raise DataError(f"data.sampler.class_name={self.name!r} yielded {what} in epoch {epoch}",
                            key="data.sampler.class_name", fix="yield dataset indices in [0, len(data_source))")
        self._order = (epoch, order)
        return order

    def remaining(self) -> int:
        return len(self.epoch_order(self.epoch)) - self.position

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), 0
        if not 0 <= int(state["position"]) <= len(self.epoch_order(self.epoch)):
            raise ValueError(f"sampler state position {state['position']} out of range for {self.name}'s epoch order")
        self.position = int(state["position"])


class RLDataLoader:
    """Batches of ``batch_size`` prompts as DataProto, resumable through ``state_dict()``.

    Each ``iter()`` yields the rest of the current epoch, then moves to the next epoch (so
    ``for epoch in ...: for batch in loader`` works, and a loader restored mid-epoch first
    finishes that epoch). With ``drop_last`` a final short batch is skipped.
    """

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        batch_size: int,
        sampler: ResumableSampler,
        collate: Callable[[list[dict[str, Any]]], DataProto],
        drop_last: bool,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.sampler = dataset, batch_size, sampler
        self.collate, self.drop_last = collate, drop_last

    def __len__(self) -> int:
        """Batches per full epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[DataProto]:
        while True:
            if self.sampler.remaining() == 0 or (self.drop_last and self.sampler.remaining() < self.batch_size):
                self.sampler.next_epoch()
                return
            indices = self.sampler.take(self.batch_size)
            yield self.collate([self.dataset[i] for i in indices])

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)
