"""The workers' side of checkpoint reliability (one Megatron rank on gloo, tiny Qwen2):

* a save writes a checksum manifest covering every file of the component (verified here
  against an independent sha256 of each file);
* resume applies the current lr / betas when optim.use_checkpoint_opt_param_scheduler=false
  (verl's default) and keeps the checkpointed schedule when true, at the checkpointed step;
* a full disk while saving (the shard file is /dev/full: the kernel's ENOSPC, which reaches
  the error only through megarl.compat.megatron_core.checkpoint_write on megatron-core 0.19)
  raises an error naming the directory and "no space left".
"""

from __future__ import annotations

import pytest

from helpers.dist_utils import run_distributed
from helpers.tiny import actor_rollout_ref_config, make_tiny_qwen2, megatron_node, rollout_batch

pytestmark = pytest.mark.slow


def _worker(model_path: str, **optim):
    from megarl.workers.actor import ActorWorker

    cfg = actor_rollout_ref_config(model_path, megatron_node())
    for key, value in optim.items():
        setattr(cfg.actor.optim, key, value)
    worker = ActorWorker(cfg, "actor", device="cpu")
    worker.init_model()
    return worker


def _body(model_path: str, batch: dict, root: str) -> dict:
    import multiprocessing
    import os

    from megarl.protocol import DataProto

    multiprocessing.current_process()._config["daemon"] = False  # megatron's writer starts processes
    out: dict = {}
    data = DataProto.from_dict(dict(batch), meta_info={"nan_policy": "stop"})
    actor = _worker(model_path, optimizer="adam", lr=0.01, betas=[0.9, 0.999])
    actor.update_policy(data)
    actor.save_checkpoint(os.path.join(root, "actor"), 1)
    out["files"] = sorted(os.path.relpath(os.path.join(d, f), os.path.join(root, "actor"))
                          for d, _, fs in os.walk(os.path.join(root, "actor")) for f in fs)

    for flag in (False, True):
        resumed = _worker(model_path, optimizer="adam", lr=1.0, betas=[0.5, 0.6], use_checkpoint_opt_param_scheduler=flag)
        resumed.load_checkpoint(os.path.join(root, "actor"))
        group = resumed.engine.optimizer.param_groups[0]
        out[flag] = {"lr": group["lr"], "betas": tuple(group["betas"]), "num_steps": resumed.engine.scheduler.num_steps}

    full = os.path.join(root, "full")
    os.makedirs(os.path.join(full, "dist_ckpt"))
    os.symlink("/dev/full", os.path.join(full, "dist_ckpt", "__0_0.distcp"))  # the one shard one rank writes
    try:
        actor.save_checkpoint(full, 2)
        out["full"] = None
    except Exception as error:  # what the worker raises is the result
        out["full"] = (type(error).__name__, getattr(error, "errno", None), str(error))
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt_reliability")
    model_path = make_tiny_qwen2(str(root / "model"), num_layers=2)
    return run_distributed(_body, 1, model_path, rollout_batch(8), str(root))[0], root


def test_save_writes_a_manifest_of_every_file(result):
    import hashlib
    import json

    out, root = result
    manifest = json.loads((root / "actor" / "checksums.json").read_text())
    listed = manifest["files"]
    assert sorted(listed) == [f for f in out["files"] if f != "checksums.json"]
    # megatron-core 0.19 keeps the common state in the shards (no common.pt)
    assert "dist_ckpt/__0_0.distcp" in listed and "dist_ckpt/.metadata" in listed
    for name, entry in listed.items():
        data = (root / "actor" / name).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(), name


def test_resume_applies_the_current_lr_unless_the_checkpointed_scheduler_is_asked_for(result):
    out, _ = result
    assert out[False] == {"lr": 1.0, "betas": (0.5, 0.6), "num_steps": 1}  # rebuilt from the config, at step 1
    assert out[True]["lr"] == pytest.approx(0.01) and out[True]["num_steps"] == 1  # the checkpoint's schedule
    assert out[True]["betas"] == (0.5, 0.6)  # not part of the schedule: always the current config


def test_full_disk_while_saving_names_the_dir_and_the_cause(result):
    import errno

    out, root = result
    kind, code, text = out["full"]
    assert code == errno.ENOSPC and "no space left" in text and str(root / "full") in text, out["full"]
    assert "No space left on device" in text  # the writer's own words are kept after the explanation
