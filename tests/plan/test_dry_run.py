"""A plan made where the job is submitted: only each model's config.json exists (no weights,
tokenizer or data files yet), and on a machine without a GPU a CUDA run's GPU packages are
judged against the stack megarl ships, not the local ones. The real run keeps every check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import megarl.plan.__main__ as plan_cli
from megarl.config import collect_issues, load_config
from megarl.config.rules.view import has_module
from megarl.plan.stack import in_gpu_stack, shipped_distributions

QWEN25_7B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 max_position_embeddings=32768, tie_word_embeddings=False)
A = "actor_rollout_ref.actor"
OTC = f"{A}.megatron.override_transformer_config"


def _overrides(model_dir: Path, *extra: str) -> list[str]:
    return [f"actor_rollout_ref.model.path={model_dir}", "data.train_files=/not/there/train.parquet",
            "data.val_files=/not/there/val.parquet", "trainer.n_gpus_per_node=8", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=8", f"{A}.megatron.tensor_model_parallel_size=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
            f"{A}.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            f"{OTC}.attention_backend=auto", *extra]  # the shipped stack has no flash-attn: auto, as the GPU scripts


@pytest.fixture
def config_only(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    return tmp_path


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(plan_cli, "_local_gpu", lambda: False)


def test_a_7b_plan_needs_only_its_config_json(config_only, no_gpu, capsys):
    assert plan_cli.main(_overrides(config_only, "trainer.device=cuda")) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    skipped = next(line for line in out.splitlines() if line.startswith("note: checks skipped"))
    assert "data files" in skipped and "model weights" in skipped and "tokenizer" in skipped
    assert "params(B)" in out and "7.616" in out and "fits:" in out
    # the real run keeps those checks
    keys = {issue.key for issue in collect_issues(load_config(_overrides(config_only, "trainer.device=cuda")))}
    assert {"data.train_files", "data.val_files", "actor_rollout_ref.model.path"} <= keys


@pytest.mark.skipif(has_module("transformer_engine") or has_module("fused_weight_gradient_mlp_cuda"),
                    reason="needs a machine without transformer-engine and apex (the CPU test machine)")
def test_dry_run_without_a_gpu_judges_te_settings_against_the_shipped_stack(config_only, no_gpu, capsys):
    te = (f"+{OTC}.apply_rope_fusion=true", f"+{OTC}.fp8=hybrid", f"+{OTC}.gradient_accumulation_fusion=true")
    assert plan_cli.main(_overrides(config_only, "trainer.device=cuda", *te)) == 0, capsys.readouterr().err
    assert "GPU packages judged against the stack megarl ships (gpu-lock.txt" in capsys.readouterr().out
    # the real run on this machine (no transformer-engine) still refuses them, naming each key
    keys = {issue.key for issue in collect_issues(load_config(_overrides(config_only, "trainer.device=cuda", *te)))}
    assert {f"{OTC}.apply_rope_fusion", f"{OTC}.fp8", f"{OTC}.gradient_accumulation_fusion"} <= keys


def test_flash_without_flash_attn_in_the_shipped_stack_runs_tes_fused_attention(config_only, no_gpu, capsys):
    """flash-attn is not in requirements/gpu-lock.txt, transformer-engine is: verl's
    attention_backend=flash is planned, with one line saying TE's fused attention runs."""
    assert plan_cli.main(_overrides(config_only, "trainer.device=cuda", f"{OTC}.attention_backend=flash")) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "attention_backend" in line]
    assert len(notes) == 1 and f"{OTC}.attention_backend=flash" in notes[0] and "fused (cuDNN)" in notes[0], notes


@pytest.mark.skipif(has_module("transformer_engine"), reason="needs a machine without transformer-engine")
def test_on_a_gpu_machine_the_local_packages_are_judged(config_only, monkeypatch, capsys):
    monkeypatch.setattr(plan_cli, "_local_gpu", lambda: True)  # a GPU node whose environment lacks TE
    assert plan_cli.main(_overrides(config_only, "trainer.device=cuda", f"+{OTC}.apply_rope_fusion=true")) == 2
    err = capsys.readouterr().err
    assert f"{OTC}.apply_rope_fusion" in err and "transformer-engine is not installed" in err


def test_the_shipped_stack():
    assert in_gpu_stack("transformer_engine") and in_gpu_stack("transformer_engine.pytorch") and in_gpu_stack("vllm")
    assert not in_gpu_stack("flash_attn") and not in_gpu_stack("fused_weight_gradient_mlp_cuda")  # no apex either
    # installed without the repository: the `gpu` extra's requirements
    assert {"transformer-engine", "vllm", "torch"} <= shipped_distributions(Path("/no/such/lock.txt"))
