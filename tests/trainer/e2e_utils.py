"""Helpers for the end-to-end trainer tests: composed configs, one Ray for a module's runs, their outputs."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


def demo_config(demo_dir: Path, run_dir: Path, overrides: list[str], small_batches: bool = True):
    """The project config with the demo assets under ``demo_dir`` and outputs under ``run_dir``,
    validated and resolved exactly as ``python -m megarl.main_ppo`` does; ``small_batches``: 4 prompts
    x 4 samples a step (else the demo profile's sizes)."""
    from megarl.config.compose import load_config
    from megarl.main_ppo import prepare

    os.environ["MEGARL_DEMO_DIR"] = str(demo_dir)
    return prepare(load_config(demo_overrides(run_dir, overrides, small_batches)))


def demo_overrides(run_dir: Path, overrides: list[str], small_batches: bool = True) -> list[str]:
    """``demo_config``'s command line (MEGARL_DEMO_DIR names the demo assets)."""
    base = [
        "trainer.device=cpu",
        "ray_kwargs.ray_init.num_cpus=2",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}/ckpt",
        f"trainer.rollout_data_dir={run_dir}/rollouts",
        "trainer.val_before_train=false",
    ]
    sizes = [
        "data.train_batch_size=4",
        "data.val_batch_size=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
    ]
    return base + (sizes if small_batches else []) + overrides


@contextlib.contextmanager
def module_ray() -> Iterator[None]:
    """A local Ray as ``run_ppo`` starts one (2 CPUs, its runtime env), for all of a module's runs:
    ``run_ppo`` joins a running Ray instead of starting and stopping its own (seconds a run)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield
    finally:
        ray.shutdown()


def read_metrics(run_dir: Path) -> dict[int, dict]:
    records = {}
    for line in (run_dir / "ckpt" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["step"], {}).update(record)
    return records


def read_rollouts(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
