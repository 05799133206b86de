"""OmegaConf's loader on libyaml (megarl.compat.omegaconf_yaml) parses what OmegaConf's own parses, equal,
and refuses what it refuses; OmegaConf.load takes it once applied."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf, _utils

from megarl.compat.omegaconf_yaml import apply_c_yaml_loader, c_yaml_loader, omegaconf_yaml_loader
from megarl.config.files import CONFIG_DIR

pytestmark = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml: nothing is patched")

# OmegaConf's float rule (1e-3 without a dot, 1_000.5), no timestamps, YAML 1.1 booleans, a pathlib tag
EDGES = """
lr: 1e-3
big: 1_000.5
dot: .5
inf: -.inf
day: 2001-12-14
flag: yes
off: off
none: null
octal: 0o17
path: !!python/object/apply:pathlib.Path [a, b]
list: [1, "2", 3.0]
nested:
  a: ${oc.env:HOME}
  b: '???'
  c: {d: 1, e: [x, y]}
"""


@pytest.fixture(scope="module")
def original():
    """OmegaConf's own loader class (a compose in this process may have applied the patch already)."""
    return omegaconf_yaml_loader()


def test_megarls_config_files_and_the_edge_cases_parse_equal(original):
    texts = [p.read_text() for p in sorted(Path(CONFIG_DIR).rglob("*.yaml"))] + [EDGES]
    assert len(texts) > 3
    for text in texts:
        assert yaml.load(text, Loader=c_yaml_loader()) == yaml.load(text, Loader=original)
    edges = yaml.load(EDGES, Loader=c_yaml_loader())
    assert edges["lr"] == 1e-3 and edges["day"] == "2001-12-14" and edges["flag"] is True


def test_a_duplicate_key_is_refused_as_omegaconf_refuses_it(original):
    for loader in (original, c_yaml_loader()):
        with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key a"):
            yaml.load("x: 1\na: 1\na: 2\n", Loader=loader)


def test_omegaconf_load_takes_the_c_loader_once_applied(tmp_path):
    apply_c_yaml_loader()
    assert issubclass(_utils.get_yaml_loader(), yaml.cyaml.CParser)
    (tmp_path / "c.yaml").write_text(EDGES)
    cfg = OmegaConf.load(tmp_path / "c.yaml")
    assert cfg.lr == 1e-3 and cfg.big == 1000.5 and cfg.path == Path("a/b")
