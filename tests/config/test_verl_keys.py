"""A verl 0.9.1 user switches by changing one module name: every key of verl's generated
`ppo_megatron_trainer.yaml` (tests/fixtures, verbatim) composes at verl's value and validates;
the embedded demo is a profile a real run never inherits."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from config_testing import no_issues, write_model
from megarl.config import load_config
from megarl.config.demo_profile import DEMO_PROFILE

VERL_YAML = Path(__file__).resolve().parents[1] / "fixtures" / "verl_0.9.1_ppo_megatron_trainer.yaml"
# verl values that only name a machine of verl's authors: a user points them at their own files.
LOCAL_PATHS = ("actor_rollout_ref.model.path", "critic.model.path", "data.train_files", "data.val_files")


def _verl_leaves() -> list[tuple[str, object]]:
    def walk(node, prefix=""):
        for key in node:
            if key == "_target_":
                continue
            value = node[key]
            if isinstance(value, dict) and value:
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return list(walk(OmegaConf.to_container(OmegaConf.load(VERL_YAML), resolve=False)))


def _cli(value: object) -> str:
    """`value` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_cli(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_cli(v)}" for k, v in value.items()) + "}"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


@pytest.fixture
def local_assets(tmp_path: Path) -> dict[str, str]:
    write_model(tmp_path / "model", max_position_embeddings=4096)  # verl's 512 + 512 tokens fit
    for name in ("train.parquet", "val.parquet"):
        (tmp_path / name).write_bytes(b"")
    model = str(tmp_path / "model")
    return {"actor_rollout_ref.model.path": model, "critic.model.path": model,
            "data.train_files": str(tmp_path / "train.parquet"), "data.val_files": str(tmp_path / "val.parquet")}


# What verl's defaults leave to the user (verl asserts them at start-up too), set the way its
# example scripts do; hardware: one CPU slot here instead of 8 GPUs.
USER_CHOICES = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
    "trainer.device=cpu", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
]


def test_every_verl_key_at_verls_value_on_the_command_line_validates(local_assets):
    """All ~870 leaves of verl's file as `key=value` overrides (interpolations as themselves)."""
    overrides = []
    for key, value in _verl_leaves():
        if key == "actor_rollout_ref.rollout.name":  # verl's ??? = "must be set"
            value = "vllm"
        if key in LOCAL_PATHS:
            value = local_assets[key]
        overrides.append(f"{key}={_cli(value)}")
    assert len(overrides) > 800
    cfg = load_config(overrides + USER_CHOICES)
    no_issues(cfg)


def test_verls_yaml_merged_as_a_users_config_file_validates(local_assets):
    """verl's file as a user's config (with its `_target_` class tags) merged over megarl's."""
    user = OmegaConf.load(VERL_YAML)
    user.actor_rollout_ref.rollout.name = "vllm"
    for key, value in local_assets.items():
        OmegaConf.update(user, key, value)
    base = load_config(["actor_rollout_ref.model.path=/placeholder"])
    OmegaConf.set_struct(base, False)
    cfg = OmegaConf.merge(base, user)
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(USER_CHOICES))
    no_issues(cfg)


def test_a_changed_verl_key_is_honoured_or_refused(local_assets):
    """Spot check of the contract: a key megarl implements takes the value, one it does not is refused."""
    from megarl.config import collect_issues

    base = [f"{k}={v}" for k, v in local_assets.items()] + USER_CHOICES
    cfg = load_config(base + ["actor_rollout_ref.actor.optim.lr=3e-6", "actor_rollout_ref.rollout.n=4"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-6 and cfg.actor_rollout_ref.actor.rollout_n == 4
    issues = collect_issues(load_config(base + ["actor_rollout_ref.actor.megatron.forward_only=true"]))
    assert [i.key for i in issues] == ["actor_rollout_ref.actor.megatron.forward_only"]


def test_megatron_fsdp_is_accepted_where_megarl_implements_it(local_assets):
    """use_megatron_fsdp trains (tests/workers/test_megatron_fsdp.py); what its path lacks is refused by key."""
    from megarl.config import collect_issues

    base = [f"{k}={v}" for k, v in local_assets.items()] + USER_CHOICES
    fsdp = "actor_rollout_ref.actor.megatron.use_megatron_fsdp=true"
    assert collect_issues(load_config(base + [fsdp])) == []
    # checkpoints: tests/workers/test_megatron_fsdp_checkpoint.py
    assert collect_issues(load_config(base + [fsdp, "trainer.save_freq=5"])) == []
    for extra, key in (("actor_rollout_ref.actor.megatron.use_distributed_optimizer=false",
                        "actor_rollout_ref.actor.megatron.use_distributed_optimizer"),
                       ("actor_rollout_ref.actor.megatron.param_offload=true", "actor_rollout_ref.actor.megatron.param_offload")):
        issues = collect_issues(load_config(base + [fsdp, extra]))
        assert [i.key for i in issues] == [key], [i.format() for i in issues]


# ------------------------------------------------------------------ the demo profile
def _profile() -> dict[str, object]:
    return OmegaConf.to_container(OmegaConf.load(DEMO_PROFILE), resolve=False)


def _raw(cfg, key):
    parent, _, leaf = key.rpartition(".")
    return OmegaConf.to_container(OmegaConf.select(cfg, parent), resolve=False)[leaf]


def test_no_model_runs_the_demo_profile():
    cfg = load_config()
    for key, value in _profile().items():
        assert _raw(cfg, key) == value, key


def test_every_demo_setting_is_absent_once_a_model_path_is_given(tmp_path):
    yaml_defaults = load_config([f"actor_rollout_ref.model.path={tmp_path}"])
    raw_yaml = OmegaConf.load(Path(DEMO_PROFILE).parents[1] / "ppo_megatron_trainer.yaml")
    for key, value in _profile().items():
        if key == "actor_rollout_ref.model.path":
            continue
        got, default = _raw(yaml_defaults, key), _raw(raw_yaml, key)
        assert got == default, f"{key}: a real run got {got!r}, the yaml default is {default!r}"
        if value != default:
            assert got != value, key


def test_user_keys_win_over_the_demo_profile():
    cfg = load_config(["data.train_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-4",
                       "trainer.logger=[console,tensorboard]"])
    assert cfg.data.train_batch_size == 4 and cfg.actor_rollout_ref.actor.optim.lr == 1e-4
    assert list(cfg.trainer.logger) == ["console", "tensorboard"]
    assert cfg.trainer.total_training_steps == _profile()["trainer.total_training_steps"]


def test_optimizer_overrides_with_a_typed_key_move_there_as_in_verl():
    """verl applies override_optimizer_config last; megarl moves such fields to their typed key."""
    from megarl.config import ConfigError

    o = "actor_rollout_ref.actor.optim"
    cfg = load_config(["actor_rollout_ref.model.path=/m", f"+{o}.override_optimizer_config.adam_beta2=0.95",
                       f"+{o}.override_optimizer_config.use_precision_aware_optimizer=true",
                       f"+{o}.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=true"])
    assert list(OmegaConf.select(cfg, f"{o}.betas")) == [0.9, 0.95]
    assert OmegaConf.select(cfg, f"{o}.use_precision_aware_optimizer") is True
    assert dict(OmegaConf.select(cfg, f"{o}.override_optimizer_config")) == {"overlap_cpu_optimizer_d2h_h2d": True}
    with pytest.raises(ConfigError, match="conflicts with actor_rollout_ref.actor.optim.lr"):
        load_config(["actor_rollout_ref.model.path=/m", f"{o}.lr=1e-5", f"+{o}.override_optimizer_config.lr=2e-5"])
