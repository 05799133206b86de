"""Schema of `trainer` (loop, logging, checkpoints, cluster size) and `ray_kwargs`."""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.names import DEVICES, LOGGERS, NAN_POLICIES, RESUME_MODES
from megarl.config.schema.field import Section, spec
from megarl.config.schema.trainer_v1 import TrainerV1Config


@dataclass
class MemoryPlanConfig(Section):
    """`trainer.memory_plan`: the launch plan (megarl.plan) that `main_ppo` runs before any worker."""

    enforce: bool = spec()
    gpu_memory_gib: float | None = spec(gt=0)
    host_memory_gib: float | None = spec(gt=0)


@dataclass
class TrainerConfig(Section):
    balance_batch: bool = spec()
    total_epochs: int = spec(ge=1)
    total_training_steps: int | None = spec(ge=1)
    project_name: str = spec()
    experiment_name: str = spec()
    logger: str | list[str] = spec(choices=LOGGERS)
    log_val_generations: int = spec(ge=0)
    rollout_data_dir: str | None = spec(path=True)
    validation_data_dir: str | None = spec(path=True)
    nnodes: int = spec(ge=1)
    n_gpus_per_node: int = spec(ge=1)
    save_freq: int = spec()
    resume_mode: str = spec(choices=RESUME_MODES)
    resume_from_path: str | None = spec(path=True)
    val_before_train: bool = spec()
    val_only: bool = spec()
    test_freq: int = spec()
    critic_warmup: int = spec(ge=0)
    default_local_dir: str = spec(path=True)
    max_actor_ckpt_to_keep: int | None = spec(ge=1)
    max_critic_ckpt_to_keep: int | None = spec(ge=1)
    device: str = spec(choices=DEVICES)
    nan_policy: str = spec(choices=NAN_POLICIES)
    memory_plan: MemoryPlanConfig = spec()
    use_v1: bool = spec()
    v1: TrainerV1Config = spec()

    def trainer_mode(self) -> str:
        """The loop that runs: `v1.trainer_mode`, or `sync` with `use_v1=false` (verl's legacy trainer, which
        reads no `trainer.v1` key)."""
        return self.v1.trainer_mode if self.use_v1 else "sync"


@dataclass
class RuntimeEnvConfig(Section):
    py_executable: str | None = spec(path=True)


@dataclass
class RayInitConfig(Section):
    num_cpus: int | None = spec(ge=1)
    runtime_env: RuntimeEnvConfig = spec()


@dataclass
class RayKwargsConfig(Section):
    ray_init: RayInitConfig = spec()
    timeline_json_file: str | None = spec(path=True)
