"""Loads never run untrusted code: pickled checkpoints are refused, trust_remote_code is off
unless set, custom reward code comes only from custom_reward_function.path."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.trainer import checkpointing as ckpt

MEGARL = Path(__file__).resolve().parents[2] / "megarl"
CONFIG = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"


class _Evil:
    """Unpickling this calls ``open(marker, "w")``: the marker proves code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_trainer_state_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    step = tmp_path / "global_step_3"
    step.mkdir()
    torch.save({"global_step": 3, "payload": _Evil(str(marker))}, step / ckpt.TRAINER_STATE)
    with pytest.raises(ckpt.UnsafeCheckpointError, match="refused to load") as info:
        ckpt.read_trainer_state(step)
    assert str(step / ckpt.TRAINER_STATE) in str(info.value)
    assert not marker.exists()
    # the reference: an unrestricted unpickle of the same file does run the payload
    torch.load(step / ckpt.TRAINER_STATE, weights_only=False)
    assert marker.exists()


def test_trainer_state_round_trips_through_a_safe_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # numpy caches a gaussian: has_gauss / cached_gaussian are set
    state = {"global_step": 7, "dataloader": {"epoch": 1, "position": 4}, "kl_coef": 0.01, "rng": ckpt.rng_state()}
    want = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(2))
    ckpt.write_trainer_state(tmp_path, state)
    loaded = ckpt.read_trainer_state(tmp_path)
    assert loaded["global_step"] == 7 and loaded["dataloader"] == {"epoch": 1, "position": 4}
    ckpt.set_rng_state(loaded["rng"])
    got = (random.random(), np.random.standard_normal(), np.random.rand(), torch.rand(2))
    assert got[:3] == want[:3] and torch.equal(got[3], want[3])


def _calls(tree: ast.AST, attr: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
            yield node


def test_no_unrestricted_unpickling_in_megarl():
    """Every torch.load in megarl/ passes weights_only=True; no pickle.load(s), no allow_pickle."""
    offenders = []
    for file in sorted(MEGARL.rglob("*.py")):
        tree = ast.parse(file.read_text())
        for call in _calls(tree, "load"):
            base = call.func.value
            if isinstance(base, ast.Name) and base.id == "torch":
                kw = {k.arg: k.value for k in call.keywords}
                if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                    offenders.append(f"{file}:{call.lineno} torch.load without weights_only=True")
            if isinstance(base, ast.Name) and base.id in ("pickle", "dill", "cloudpickle", "joblib"):
                offenders.append(f"{file}:{call.lineno} {base.id}.load")
        for call in _calls(tree, "loads"):
            if isinstance(call.func.value, ast.Name) and call.func.value.id in ("pickle", "dill", "cloudpickle"):
                offenders.append(f"{file}:{call.lineno} {call.func.value.id}.loads")
        for call in ast.walk(tree):
            if isinstance(call, ast.Call):
                for k in call.keywords:
                    if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                        offenders.append(f"{file}:{call.lineno} allow_pickle")
    assert not offenders, offenders


def test_trust_remote_code_is_off_by_default():
    cfg = OmegaConf.load(CONFIG)
    assert cfg.actor_rollout_ref.model.trust_remote_code is False
    assert OmegaConf.to_container(cfg, resolve=True)["critic"]["model"]["trust_remote_code"] is False
    assert cfg.data.trust_remote_code is False
    assert cfg.reward_model.model.trust_remote_code is None  # verl's legacy key: null = not set (no reward model)


def test_every_from_pretrained_in_megarl_is_explicit_about_remote_code():
    """A from_pretrained call either passes trust_remote_code (read from the config) or relies on
    transformers' default False; never a literal True."""
    for file in sorted(MEGARL.rglob("*.py")):
        for call in _calls(ast.parse(file.read_text()), "from_pretrained"):
            for k in call.keywords:
                if k.arg == "trust_remote_code":
                    assert not (isinstance(k.value, ast.Constant) and k.value.value is True), f"{file}:{call.lineno}"


def _evil_tokenizer_dir(root: Path, marker: Path) -> Path:
    """An HF dir whose tokenizer is custom code that writes ``marker`` when imported."""
    model = root / "evil_model"
    model.mkdir()
    (model / "evil_tokenizer.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizer\n"
        "class EvilTokenizer(PreTrainedTokenizer):\n    pass\n"
    )
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["evil_tokenizer.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"}))
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "auto_map": {"AutoConfig": "evil_tokenizer.X"}}))
    return model


@pytest.mark.parametrize("trust", [False, True])
def test_preflight_tokenizer_runs_model_code_only_with_trust_remote_code(tmp_path, monkeypatch, trust):
    from megarl.preflight.run import load_tokenizer

    marker = tmp_path / "ran"
    model = _evil_tokenizer_dir(tmp_path, marker)
    cfg = OmegaConf.load(CONFIG)
    cfg.data.tokenizer = str(model)
    cfg.actor_rollout_ref.model.trust_remote_code = trust
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load_tokenizer(cfg)  # fails either way (the custom class is a stub), reported as an issue
    assert marker.exists() is trust  # the reference: the code does run when allowed


REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {score}\n"


def test_custom_reward_code_is_loaded_only_from_the_configured_path(tmp_path, monkeypatch):
    from megarl.reward import default_compute_score, load_reward_fn

    # A module named like a reward file on sys.path / in the working dir is never picked up.
    (tmp_path / "reward.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n" + REWARD.format(score=5.0))
    (tmp_path / "compute_score.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_fn(OmegaConf.create({"path": None, "name": "compute_score"}))
    assert fn is default_compute_score and not (tmp_path / "ran").exists()
    # The configured file is the one that runs.
    chosen = tmp_path / "sub" / "my_reward.py"
    chosen.parent.mkdir()
    chosen.write_text(REWARD.format(score=0.25))
    fn = load_reward_fn(OmegaConf.create({"path": str(chosen), "name": "compute_score"}))
    assert fn("x", "y", "z") == 0.25 and not (tmp_path / "ran").exists()


def _dcp_save(directory: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(directory), no_dist=True)


def test_clean_dist_checkpoint_passes_and_loads(tmp_path):
    from megarl.utils.safe_checkpoint import verify_dist_checkpoint

    np.random.seed(0)
    _dcp_save(tmp_path, {"w": torch.arange(6.0), "rng": {"numpy": np.random.get_state(), "python": random.getstate()}})
    verify_dist_checkpoint(str(tmp_path))
    # the reference: torch's own (unrestricted) loader reads the same checkpoint
    import torch.distributed.checkpoint as dcp

    target = {"w": torch.zeros(6), "rng": {"numpy": None, "python": None}}
    dcp.load(target, checkpoint_id=str(tmp_path), no_dist=True)
    assert torch.equal(target["w"], torch.arange(6.0)) and target["rng"]["numpy"][0] == "MT19937"


def test_dist_checkpoint_with_pickled_payload_item_is_refused(tmp_path):
    from megarl.utils.safe_checkpoint import UnsafeCheckpointError, verify_dist_checkpoint

    marker = tmp_path / "pwned"
    ckpt_dir = tmp_path / "dist_ckpt"
    _dcp_save(ckpt_dir, {"w": torch.ones(2), "rng_state": _Evil(str(marker))})
    with pytest.raises(UnsafeCheckpointError, match=r"refused to load item 'rng_state'") as info:
        verify_dist_checkpoint(str(ckpt_dir))
    assert ".distcp" in str(info.value) and not marker.exists()
    # the reference: torch's loader would run it
    import torch.distributed.checkpoint as dcp

    dcp.load({"w": torch.zeros(2), "rng_state": None}, checkpoint_id=str(ckpt_dir), no_dist=True)
    assert marker.exists()


def test_dist_checkpoint_with_pickled_payload_index_is_refused(tmp_path):
    import pickle

    from megarl.utils.safe_checkpoint import UnsafeCheckpointError, verify_dist_checkpoint

    marker = tmp_path / "pwned"
    _dcp_save(tmp_path, {"w": torch.ones(2)})
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Evil(str(marker))))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: refused to load the checkpoint index.*open is not part"):
        verify_dist_checkpoint(str(tmp_path))
    assert not marker.exists()


def test_resume_verifies_worker_checkpoints_before_loading(tmp_path):
    """trainer.load_checkpoint's check (checkpointing.verify_components) covers actor/ and critic/."""
    from megarl.utils.safe_checkpoint import UnsafeCheckpointError

    marker = tmp_path / "pwned"
    step = tmp_path / "global_step_1"
    _dcp_save(step / "actor" / "dist_ckpt", {"w": torch.ones(2)})
    _dcp_save(step / "critic" / "dist_ckpt", {"w": torch.ones(2), "extra": _Evil(str(marker))})
    with pytest.raises(UnsafeCheckpointError, match="critic"):
        ckpt.verify_components(step)
    assert not marker.exists()
    ckpt.verify_components(step, ("actor",))
