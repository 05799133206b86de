"""python -m megarl.model_merger (verl's CLI): a TP=2 checkpoint of a trained actor becomes an HF
directory that transformers loads and whose weights equal the live export of the saving run,
bitwise (the reference is the TP=2 workers' own gather, not the merger's TP=1 reload)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, megatron_node, rollout_batch
from worker_bodies import trained_tp_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(model dir, actor checkpoint dir, rank 0's live export) of one PPO step at TP=2."""
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    root = tmp_path_factory.mktemp("merger")
    model_path = make_tiny_qwen2(str(root / "model"))
    build_demo_tokenizer().save_pretrained(model_path)  # a tokenizer for the merger to carry over
    ckpt = str(root / "global_step_1" / "actor")
    live = run_distributed(trained_tp_checkpoint, 2, model_path, rollout_batch(8),
                           megatron_node(tensor_model_parallel_size=2), ckpt, timeout=400)[0]
    return model_path, ckpt, live


def _merger(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "megarl.model_merger", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_merged_tp2_checkpoint_equals_live_export(saved, tmp_path):
    import transformers
    from safetensors.torch import load_file

    model_path, ckpt, live = saved
    target = tmp_path / "hf"
    proc = _merger("merge", "--backend", "megatron", "--local_dir", ckpt, "--target_dir", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    initial = load_file(f"{model_path}/model.safetensors")
    assert max((live[k] - initial[k]).abs().max().item() for k in initial) > 1e-3  # the step moved the weights
    merged = load_file(str(target / "model.safetensors"))
    assert merged.keys() == live.keys() == initial.keys()
    for name, tensor in live.items():
        assert merged[name].dtype == tensor.dtype and torch.equal(merged[name], tensor), name

    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in live.items():
        assert torch.equal(state[name], tensor), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target))
    assert tokenizer("1 + 2 =")["input_ids"] == transformers.AutoTokenizer.from_pretrained(model_path)("1 + 2 =")["input_ids"]

    # `test` (verl's check against a reference dir) sees the step's change against the initial model
    against_initial = _merger("test", "--backend", "megatron", "--local_dir", ckpt, "--test_hf_dir", model_path, cwd=tmp_path)
    assert against_initial.returncode == 1 and f"differs from {model_path}: lm_head.weight: Tensor-likes are not close" in against_initial.stderr, against_initial.stderr[-2000:]


def test_compare_dirs_passes_equal_and_names_a_changed_tensor(tmp_path):
    from safetensors.torch import save_file

    from megarl.model_merger import compare_dirs

    weights = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(3)}
    for name, changed in (("same", {}), ("other", {"b.bias": torch.tensor([1.0, 1.0, 1.5])})):
        (tmp_path / name).mkdir()
        save_file({**weights, **changed}, str(tmp_path / name / "model.safetensors"))
    compare_dirs(tmp_path / "same", tmp_path / "same")
    with pytest.raises(AssertionError, match="b.bias"):
        compare_dirs(tmp_path / "other", tmp_path / "same")


def test_bad_arguments_are_named(saved, tmp_path, capsys):
    from megarl.model_merger import main

    _, ckpt, _ = saved
    fsdp_dir = tmp_path / "fsdp_step"
    (fsdp_dir / "fsdp_dtensor").mkdir(parents=True)  # what an FSDP save writes (tests/workers/test_megatron_fsdp_checkpoint.py)
    cases = [
        (["--backend", "fsdp", "--local_dir", ckpt], "--backend fsdp"),
        (["--backend", "megatron", "--local_dir", str(tmp_path)], "no dist_ckpt/"),
        (["--backend", "megatron", "--local_dir", str(fsdp_dir)], "Megatron-FSDP checkpoint (fsdp_dtensor/"),
        (["--backend", "megatron", "--local_dir", ckpt, "--is-value-model"], "drop --is-value-model"),
        (["--backend", "megatron", "--local_dir", ckpt, "--hf_model_path", str(tmp_path)], "give --hf_model_path"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["merge", *args, "--target_dir", str(tmp_path / "out")])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, args


def test_generation_merges_a_checkpoint_step_dir(saved, tmp_path):
    """main_generation's model.path may be a checkpoint step dir: it is merged (actor/) to HF first."""
    from pathlib import Path

    from safetensors.torch import load_file

    from megarl.main_generation import hf_model_dir

    model_path, ckpt, live = saved
    assert hf_model_dir(model_path, str(tmp_path)) == model_path  # an HF dir is used as it is
    merged = hf_model_dir(str(Path(ckpt).parent), str(tmp_path))
    tensors = load_file(str(Path(merged) / "model.safetensors"))
    assert all(torch.equal(tensors[name], tensor) for name, tensor in live.items())
