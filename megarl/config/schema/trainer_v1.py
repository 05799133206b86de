"""Schema of `trainer.v1`: verl 0.9.1's V1 trainer modes (megarl.trainer.v1 runs them).

verl's keys, verl's defaults (the yaml). What megarl reads:

* `trainer_mode`: `sync` (generate, then train) | `colocate_async` (the engines on the trainer's GPUs
  keep generating across steps, time-sliced with training, with partial rollout) | `separate_async`
  (engines on their own GPUs, `actor_rollout_ref.rollout.nnodes` x `n_gpus_per_node`, generating while
  the trainer trains; weights pushed after each step);
* `*.num_warmup_batches`: how many batches of prompts are admitted beyond the one being trained (the
  pipeline depth; fractional allowed, as in verl);
* `sampler.max_off_policy_threshold`: the most policy versions a sample may span, verl's count
  (1 = trained under the policy that generated every token; null = no bound);
* `sampler.max_off_policy_strategy`: `drop` (verl: train the earliest-admitted finished groups, evict
  and replace a group that would exceed the threshold) | `wait` (train the oldest groups, waiting for
  them: nothing is ever discarded).
"""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.names import OFF_POLICY_STRATEGIES, TRAINER_MODES
from megarl.config.schema.field import Section, spec


@dataclass
class ColocateAsyncConfig(Section):
    num_warmup_batches: float = spec(ge=0)


@dataclass
class SeparateAsyncConfig(Section):
    num_warmup_batches: float = spec(ge=0)
    parameter_sync_step: int = spec(ge=1)


@dataclass
class SamplerConfig(Section):
    max_off_policy_threshold: int | None = spec(ge=1)
    max_off_policy_strategy: str = spec(choices=OFF_POLICY_STRATEGIES)


@dataclass
class TrainerV1Config(Section):
    trainer_mode: str = spec(choices=TRAINER_MODES)
    colocate_async: ColocateAsyncConfig = spec()
    separate_async: SeparateAsyncConfig = spec()
    sampler: SamplerConfig = spec()

    def warmup_batches(self) -> float:
        """`num_warmup_batches` of the chosen async mode (0 in sync mode)."""
        if self.trainer_mode == "colocate_async":
            return float(self.colocate_async.num_warmup_batches)
        if self.trainer_mode == "separate_async":
            return float(self.separate_async.num_warmup_batches)
        return 0.0
