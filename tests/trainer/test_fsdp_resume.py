"""A Megatron-FSDP run (`megatron.use_megatron_fsdp`) whose trainer.default_local_dir holds a
checkpoint (an earlier DDP run's) is refused when the trainer chooses what to resume, before Ray or
any worker starts, naming trainer.resume_mode, the folder and the fixes."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from megarl.config import CONFIG_DIR, CONFIG_NAME, ConfigError, typed_config
from megarl.trainer import checkpointing as ckpt
from megarl.trainer.ppo_trainer import RayPPOTrainer
from megarl.utils.checksums import write_manifest

ACTOR_FSDP = "actor_rollout_ref.actor.megatron.use_megatron_fsdp"


def _save(root: Path, step: int) -> None:
    """A complete checkpoint as RayPPOTrainer.save_checkpoint leaves it (the actor's files faked)."""
    path = ckpt.begin_save(str(root), step)
    (path / "actor").mkdir()
    (path / "actor" / "weights.bin").write_bytes(b"a" * 16)
    write_manifest(path / "actor")
    ckpt.write_trainer_state(path, {"global_step": step})
    ckpt.finish_save(str(root), step, {})


def _plan_resume(root: Path, *dotted: str):
    cfg = OmegaConf.load(Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml")
    cfg.trainer.default_local_dir = str(root)
    for item in dotted:
        key, value = item.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    trainer = types.SimpleNamespace(cfg=typed_config(cfg), use_critic=False, ckpt_root=str(root))
    return RayPPOTrainer._plan_resume(trainer)  # what RayPPOTrainer.__init__ runs before Ray starts


def test_fsdp_run_refuses_to_resume_a_checkpoint(tmp_path):
    _save(tmp_path, 3)
    with pytest.raises(ConfigError) as refusal:
        _plan_resume(tmp_path, f"{ACTOR_FSDP}=true")
    message = str(refusal.value)
    assert "trainer.resume_mode" in message and str(tmp_path / "global_step_3") in message, message
    for fix in ("trainer.resume_mode=disable", "trainer.default_local_dir", f"{ACTOR_FSDP}=false"):
        assert fix in message, (fix, message)


def test_the_same_folder_resumes_without_fsdp_or_with_resume_disabled(tmp_path):
    _save(tmp_path, 3)
    path, state = _plan_resume(tmp_path)
    assert path == tmp_path / "global_step_3" and state["global_step"] == 3
    assert _plan_resume(tmp_path, f"{ACTOR_FSDP}=true", "trainer.resume_mode=disable") == (None, None)


def test_fsdp_run_with_an_empty_folder_starts(tmp_path):
    assert _plan_resume(tmp_path / "empty", f"{ACTOR_FSDP}=true") == (None, None)
