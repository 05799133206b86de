"""A checkpoint resumes only with the data-parallel wrapper it was saved with
(`megatron.use_megatron_fsdp`, stored in its run_config.json): a Megatron-FSDP run finding a DDP
checkpoint (or one written before the run config was stored: DDP), or a DDP run finding an FSDP one,
is refused when the trainer chooses what to resume, before Ray or any worker starts, naming the key,
the folder and the fixes; the same wrapper resumes. A Megatron-FSDP checkpoint's weights resume only at the
TP/PP/VPP/CP/EP layout that wrote them (refused there too, naming the keys that changed); DDP's reshard."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from megarl.config import CONFIG_DIR, CONFIG_NAME, ConfigError, typed_config
from megarl.trainer import checkpointing as ckpt
from megarl.trainer.ppo_trainer import RayPPOTrainer
from megarl.trainer.resume_config import run_record
from megarl.utils.checksums import write_manifest

ACTOR_FSDP = "actor_rollout_ref.actor.megatron.use_megatron_fsdp"


def _typed(root: Path, *dotted: str):
    cfg = OmegaConf.load(Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml")
    cfg.trainer.default_local_dir = str(root)
    for item in dotted:
        key, value = item.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    return typed_config(cfg)


def _save(root: Path, step: int, *dotted: str, record: bool = True) -> None:
    """A complete checkpoint as RayPPOTrainer.save_checkpoint leaves it (the actor's files faked), written
    by a run with `dotted` (its run_config.json; none with record=False, as older megarl)."""
    path = ckpt.begin_save(str(root), step)
    (path / "actor").mkdir()
    (path / "actor" / "weights.bin").write_bytes(b"a" * 16)
    write_manifest(path / "actor")
    ckpt.write_trainer_state(path, {"global_step": step})
    if record:
        ckpt.write_run_config(path, run_record(_typed(root, *dotted), use_critic=False))
    ckpt.finish_save(str(root), step, {})


def _plan_resume(root: Path, *dotted: str):
    trainer = types.SimpleNamespace(cfg=_typed(root, *dotted), use_critic=False, ckpt_root=str(root))
    return RayPPOTrainer._plan_resume(trainer)  # what RayPPOTrainer.__init__ runs before Ray starts


def _refusal(root: Path, *dotted: str) -> str:
    with pytest.raises(ConfigError) as refusal:
        _plan_resume(root, *dotted)
    return str(refusal.value)


@pytest.mark.parametrize("record", [True, False])
def test_fsdp_run_refuses_a_ddp_checkpoint(tmp_path, record):
    _save(tmp_path, 3, record=record)
    message = _refusal(tmp_path, f"{ACTOR_FSDP}=true")
    assert ACTOR_FSDP in message and str(tmp_path / "global_step_3") in message, message
    for fix in (f"{ACTOR_FSDP}=false", "trainer.resume_mode=disable", "trainer.default_local_dir"):
        assert fix in message, (fix, message)


def test_ddp_run_refuses_an_fsdp_checkpoint(tmp_path):
    _save(tmp_path, 3, f"{ACTOR_FSDP}=true")
    message = _refusal(tmp_path)
    assert f"{ACTOR_FSDP}=true to continue that run" in message and "DTensor" in message, message


def test_the_same_wrapper_resumes(tmp_path):
    _save(tmp_path / "ddp", 3)
    path, state = _plan_resume(tmp_path / "ddp")
    assert path == tmp_path / "ddp" / "global_step_3" and state["global_step"] == 3
    _save(tmp_path / "fsdp", 2, f"{ACTOR_FSDP}=true")
    path, state = _plan_resume(tmp_path / "fsdp", f"{ACTOR_FSDP}=true")
    assert path == tmp_path / "fsdp" / "global_step_2" and state["global_step"] == 2
    assert _plan_resume(tmp_path / "ddp", f"{ACTOR_FSDP}=true", "trainer.resume_mode=disable") == (None, None)


def test_fsdp_run_with_an_empty_folder_starts(tmp_path):
    assert _plan_resume(tmp_path / "empty", f"{ACTOR_FSDP}=true") == (None, None)


ACTOR = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize("changed", [
    {"tensor_model_parallel_size": 2},
    {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
    {"context_parallel_size": 2, "expert_model_parallel_size": 2},
])
@pytest.mark.parametrize("contents", ["[model]", "[model,optimizer,extra]"])
def test_fsdp_checkpoint_at_another_layout_is_refused(tmp_path, changed, contents):
    """Refused here, not by the workers once loading (megarl.workers.megatron.checkpoint._check_fsdp_layout)."""
    _save(tmp_path, 3, f"{ACTOR_FSDP}=true")
    message = _refusal(tmp_path, f"{ACTOR_FSDP}=true", f"actor_rollout_ref.actor.checkpoint.load_contents={contents}",
                       *(f"{ACTOR}.{k}={v}" for k, v in changed.items()))
    assert str(tmp_path / "global_step_3") in message, message
    for key in changed:
        assert f"{ACTOR}.{key}: 1 -> 2" in message and f"{ACTOR}.{key}=1" in message, message
    for fix in ("trainer.resume_mode=disable", "trainer.default_local_dir"):
        assert fix in message, (fix, message)


def test_fsdp_checkpoint_resumes_at_its_own_layout(tmp_path):
    layout = (f"{ACTOR}.tensor_model_parallel_size=2", f"{ACTOR}.pipeline_model_parallel_size=2")
    _save(tmp_path, 3, f"{ACTOR_FSDP}=true", *layout)
    path, state = _plan_resume(tmp_path, f"{ACTOR_FSDP}=true", *layout)
    assert path == tmp_path / "global_step_3" and state["global_step"] == 3
    # without model and optimizer among load_contents the workers load no shards: nothing to refuse
    path, _ = _plan_resume(tmp_path, f"{ACTOR_FSDP}=true", "actor_rollout_ref.actor.checkpoint.load_contents=[extra]")
    assert path == tmp_path / "global_step_3"


def test_ddp_checkpoint_at_another_layout_resumes(tmp_path):
    """DDP's dist checkpoint reshards (its optimizer state too when saved fully_reshardable): a new TP resumes."""
    reshardable = f"{ACTOR}.dist_ckpt_optim_fully_reshardable=true"
    _save(tmp_path, 3, reshardable)
    path, _ = _plan_resume(tmp_path, reshardable, f"{ACTOR}.tensor_model_parallel_size=2")
    assert path == tmp_path / "global_step_3"
