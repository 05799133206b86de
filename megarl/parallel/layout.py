"""The parallel layout of one world of ranks: its sizes, the rules they obey, each rank's place.

:class:`ParallelLayout` is the one place that does Megatron's layout arithmetic. The config
rules (``megarl/config/rules/parallel.py``, ``rules/batch.py``) turn its :meth:`problems`
into issues naming the keys; :func:`megarl.parallel.init_distributed` calls
:meth:`~ParallelLayout.validate` and hands its sizes to megatron's
``initialize_model_parallel``; the trainer cuts batches by its :meth:`coordinates`.

Ranks are numbered in megatron-core's default order ``tp-cp-ep-dp-pp`` (the first name
varies fastest, ``pp`` slowest), which :data:`MEGATRON_ORDER` passes to megatron::

    dense layers:  rank = tp + TP * (cp + CP * (dp + DP * pp))
    expert layers: rank = etp + ETP * (ep + EP * (expert_dp + EXPERT_DP * pp))

(upper case = sizes). Expert layers have their own data-parallel size
``world / (ETP * EP * PP)`` and no context parallelism; both numberings share the
pipeline stage of a rank.

A vLLM rollout of tensor-parallel size ``t`` over the same world is
``ParallelLayout(world_size, tp=t)``: its ``dp`` is the number of engine replicas, a
rank's ``coordinates(rank).dp`` its replica (ranks ``r*t .. r*t+t-1``) and tp rank 0 the
replica's head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["MEGATRON_KEYS", "MEGATRON_ORDER", "LayoutProblem", "ParallelLayout", "RankCoordinates"]

MEGATRON_ORDER = "tp-cp-ep-dp-pp"

# Layout size -> its megatron key (verl's `*.megatron` config node, megatron's TransformerConfig).
MEGATRON_KEYS = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}


@dataclass(frozen=True)
class LayoutProblem:
    """One broken layout rule. ``size``: the layout size to change (a key of
    :data:`MEGATRON_KEYS`); ``message``: what is wrong, with the numbers."""

    size: str
    message: str


@dataclass(frozen=True)
class RankCoordinates:
    """A rank's index (0-based) in each of its parallel groups.

    ``dp``/``tp``/``pp``/``cp``: dense layers; ``expert_dp``/``ep``/``etp``: expert layers
    (same ``pp``).
    """

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    expert_dp: int


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of a Megatron world (one model's ranks), numbered in :data:`MEGATRON_ORDER`.

    ``world_size`` ranks = ``dp`` x ``tp`` x ``pp`` x ``cp`` for dense layers and
    ``expert_dp`` x ``etp`` x ``ep`` x ``pp`` for expert layers. ``vpp``: model chunks per
    pipeline stage of the interleaved schedule (None = not interleaved). ``etp``: tensor
    parallel size of the experts; None means ``tp`` (megatron's rule) and is stored as
    ``tp``.

    Construction only checks that every size is a positive integer (ValueError); whether
    the sizes fit the world is :meth:`problems` / :meth:`validate`, so that config checks
    can report every broken rule at once.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("vpp", "etp"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                key = f"megatron.{MEGATRON_KEYS[f.name]}" if f.name in MEGATRON_KEYS else "world_size"
                allowed = " or null" if f.name in ("vpp", "etp") else ""
                raise ValueError(f"{key} must be a positive integer{allowed}, got {value!r}")
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)

    @classmethod
    def from_megatron_config(cls, megatron_cfg: Any, world_size: int) -> ParallelLayout:
        """The layout of ``world_size`` ranks given by a megatron config.

        ``megatron_cfg`` has the attributes of :data:`MEGATRON_KEYS`'s values: verl's typed
        ``megatron`` config, a DictConfig of it, or megatron's TransformerConfig. A plain
        mapping (tests, scripts) may leave sizes out: a missing size is 1 (vpp, etp: None).
        """
        if isinstance(megatron_cfg, Mapping) and not hasattr(megatron_cfg, MEGATRON_KEYS["tp"]):
            sizes = {size: megatron_cfg[key] for size, key in MEGATRON_KEYS.items() if key in megatron_cfg}
        else:
            sizes = {size: getattr(megatron_cfg, key) for size, key in MEGATRON_KEYS.items()}
        return cls(world_size=world_size, **sizes)

    @classmethod
    def from_parallel_state(cls) -> ParallelLayout:
        """The layout megatron's parallel_state was initialised with (torch.distributed's world)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        return cls(
            world_size=dist.get_world_size(),
            tp=ps.get_tensor_model_parallel_world_size(),
            pp=ps.get_pipeline_model_parallel_world_size(),
            vpp=ps.get_virtual_pipeline_model_parallel_world_size(),
            cp=ps.get_context_parallel_world_size(),
            ep=ps.get_expert_model_parallel_world_size(),
            etp=ps.get_expert_tensor_parallel_world_size(),
        )

    # ------------------------------------------------------------------ sizes
    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one data-parallel slice of the batch: tp x pp x cp."""
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense layers: world / (tp x pp x cp)."""
        return self.world_size // self.model_parallel_size

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert layers (megatron's): world / (etp x ep x pp)."""
        return self.world_size // (self.etp * self.ep * self.pp)

    # ------------------------------------------------------------------ rules
    def problems(self, world_name: str = "the world size") -> list[LayoutProblem]:
        """Every rule the sizes break (empty list = the layout fits the world).

        Rules (megatron-core's ``initialize_model_parallel``): tp x pp x cp divides the
        world; then etp x ep x pp divides the world; vpp is only set with pp > 1.
        ``world_name`` says in the messages where the world size comes from.
        """
        found = []
        world, pp = self.world_size, self.pp
        if world % self.model_parallel_size:
            found.append(LayoutProblem("tp", (
                f"tp={self.tp} x pp={pp} x cp={self.cp} = {self.model_parallel_size} "
                f"does not divide {world_name} = {world}"
            )))
        elif (world // pp) % (self.ep * self.etp):
            # Checked once the dense rule holds: with etp = tp (the default) its fix is the same.
            found.append(LayoutProblem("ep", (
                f"ep={self.ep} x expert tp={self.etp} = {self.ep * self.etp} does not divide "
                f"world / pp = {world // pp} ranks per pipeline stage"
            )))
        if self.vpp is not None and pp == 1:
            found.append(LayoutProblem(
                "vpp", "the interleaved (virtual) pipeline needs pipeline_model_parallel_size > 1"
            ))
        return found

    def validate(self) -> None:
        """Raise ValueError listing every broken rule (see :meth:`problems`)."""
        found = self.problems()
        if found:
            raise ValueError(
                f"parallel layout {self} does not fit its world: "
                + "; ".join(f"{p.message} (megatron.{MEGATRON_KEYS[p.size]})" for p in found)
            )

    def megatron_sizes(self) -> dict[str, int | None]:
        """The sizes under their megatron names (:data:`MEGATRON_KEYS`): keyword arguments of
        TransformerConfig and, with ``order=MEGATRON_ORDER``, of ``initialize_model_parallel``."""
        return {key: getattr(self, size) for size, key in MEGATRON_KEYS.items()}

    # ------------------------------------------------------------------ ranks
    def coordinates(self, rank: int) -> RankCoordinates:
        """Where global ``rank`` sits. Raises ValueError for a layout that does not fit its world."""
        self.validate()
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size} ranks")
        rest, tp = divmod(rank, self.tp)
        rest, cp = divmod(rest, self.cp)
        pp, dp = divmod(rest, self.dp)
        rest, etp = divmod(rank, self.etp)
        rest, ep = divmod(rest, self.ep)
        _, expert_dp = divmod(rest, self.expert_dp)
        return RankCoordinates(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, expert_dp=expert_dp)

    def rank(self, *, dp: int = 0, tp: int = 0, pp: int = 0, cp: int = 0) -> int:
        """The global rank at these dense-layer coordinates (inverse of :meth:`coordinates`)."""
        for name, index, size in (("dp", dp, self.dp), ("tp", tp, self.tp), ("pp", pp, self.pp), ("cp", cp, self.cp)):
            if not 0 <= index < size:
                raise ValueError(f"{name} rank {index} is outside 0..{size - 1}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def output_ranks(self) -> list[int]:
        """Per data-parallel rank, in dp order, the rank that holds its outputs: tp rank 0 of
        the last pipeline stage, cp rank 0 (where megatron computes the loss)."""
        return [self.rank(dp=d, pp=self.pp - 1) for d in range(self.dp)]
