"""The embedded demo as a profile: megarl/configs/megatron/profiles/demo.yaml fills the keys the user did
not set, and only when no model is given (`actor_rollout_ref.model.path` null). A demo run with
`actor_rollout_ref.rollout.multi_turn.enable=true` (e.g. `+tools=calculator`) runs the demo's tool task:
profiles/demo_tools.yaml's keys replace demo.yaml's (megarl.data.demo_tool_data)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from megarl.config.files import CONFIG_DIR

DEMO_PROFILE = Path(CONFIG_DIR) / "profiles" / "demo.yaml"
DEMO_TOOLS_PROFILE = Path(CONFIG_DIR) / "profiles" / "demo_tools.yaml"
MODEL_KEY = "actor_rollout_ref.model.path"


def override_keys(overrides: Sequence[str]) -> set[str]:
    """Dotted keys a Hydra command line sets (`a.b=1`, `+a.b=1`, `++a.b=1`, `~a.b`)."""
    keys = set()
    for arg in overrides:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue
        key = arg.split("=", 1)[0].lstrip("+~").strip()
        if key and "/" not in key and "@" not in key and not key.startswith("hydra."):
            keys.add(key)
    return keys


def wants_demo(cfg: DictConfig) -> bool:
    node = cfg.actor_rollout_ref.model
    return "path" in node and OmegaConf.to_container(node, resolve=False)["path"] is None


def _set_by_user(key: str, user_keys: Iterable[str]) -> bool:
    return any(key == u or key.startswith(u + ".") for u in user_keys)


def apply_demo_profile(cfg: DictConfig, user_keys: Iterable[str]) -> dict[str, object]:
    """When `cfg` names no model, set every demo-profile key the user did not set; returns them."""
    if not wants_demo(cfg):
        return {}
    user_keys = set(user_keys)
    profile = OmegaConf.to_container(OmegaConf.load(DEMO_PROFILE), resolve=False)
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        profile.update(OmegaConf.to_container(OmegaConf.load(DEMO_TOOLS_PROFILE), resolve=False))
    applied: dict[str, object] = {}
    for key, value in profile.items():
        if _set_by_user(key, user_keys):
            continue
        OmegaConf.update(cfg, key, value, merge=False)
        applied[key] = value
    return applied


def demo_banner(applied: dict[str, object]) -> str:
    """The one line a demo run prints."""
    shown = ", ".join(f"{k}={v}" for k, v in applied.items() if k != MODEL_KEY and "_files" not in k)
    return (f"megarl: no actor_rollout_ref.model.path given: running the embedded CPU demo "
            f"(megarl/{DEMO_PROFILE.relative_to(DEMO_PROFILE.parents[3])}): {shown}")
