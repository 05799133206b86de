"""megarl/configs/megatron/profiles/demo.yaml (and demo_tools.yaml, the tool task's): a flat mapping of
existing dotted keys, each line with its reason, that passes the schema when applied to the yaml."""

import copy
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from megarl.config import CONFIG_DIR, check_schema

PROFILES = [Path(CONFIG_DIR) / "profiles" / name for name in ("demo.yaml", "demo_tools.yaml")]
_ABSENT = object()


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_line_is_a_dotted_key_with_a_reason(profile):
    lines = [line for line in profile.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines
    for line in lines:
        key, _, rest = line.partition(": ")
        assert "." in key and not line.startswith(" "), line  # flat: one dotted key per line
        assert "  # " in rest, f"no reason given: {line}"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_profile_keys_exist_and_pass_the_schema(default_cfg, path):
    profile = yaml.safe_load(path.read_text())
    cfg = copy.deepcopy(default_cfg)
    for key, value in profile.items():
        assert OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT, f"{key} is not a key of the yaml"
        OmegaConf.update(cfg, key, value)
    assert check_schema(cfg) == []
