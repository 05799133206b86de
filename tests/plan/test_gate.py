"""`main_ppo` runs the memory plan before Ray or any worker starts: a GPU run that cannot fit exits
2 naming the keys to change; `trainer.memory_plan.enforce=false` starts it anyway; CPU runs
are never refused by it."""

from __future__ import annotations

import json
import sys

import pytest

import megarl.main_ppo as main_ppo
from megarl.plan.gate import SKIP_HINT

QWEN25_7B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 max_position_embeddings=32768, tie_word_embeddings=False)
A = "actor_rollout_ref.actor"


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """run_main(*overrides) -> (exit code, stdout, stderr, whether the trainer was entered): the real
    entry point in this process on a 7B-shaped model dir (config.json + an empty weights file, as
    validation checks only its presence); the trainer and the data preflight are stand-ins."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_7B))
    (model / "model.safetensors").touch()
    (tmp_path / "train.parquet").touch()
    entered = []

    def trainer(cfg):
        import ray

        assert not ray.is_initialized()
        entered.append(cfg)

    monkeypatch.setattr("megarl.trainer.run_ppo", trainer)
    monkeypatch.setattr(main_ppo, "preflight", lambda cfg: None)  # tokenizer / data / this machine's GPUs

    def run(*overrides: str):
        monkeypatch.setattr(sys, "argv", [
            "main_ppo", "--config-name=ppo_megatron_trainer", f"actor_rollout_ref.model.path={model}",
            f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files={tmp_path / 'train.parquet'}",
            "trainer.n_gpus_per_node=1", "trainer.logger=console", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=8",
            "data.max_prompt_length=512", "data.max_response_length=1024", f"{A}.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", f"hydra.run.dir={tmp_path / 'hydra'}",
            *overrides])
        code = 0
        try:
            main_ppo.cli()
        except SystemExit as exit_:
            code = exit_.code
        out = capsys.readouterr()
        return code, out.out, out.err, bool(entered)

    return run


def test_7b_on_one_80gib_gpu_is_refused_before_any_worker(run_main):
    # 7.6 B parameters at TP=1: 16 bytes each (bf16 weights, fp32 grads, Adam) = 113 GiB in update_actor
    code, out, err, entered = run_main("trainer.device=cuda", "trainer.memory_plan.gpu_memory_gib=80")
    assert code == 2 and not entered
    assert "phase update_actor needs" in err and "the GPU has 80 GiB" in err
    for key in (f"{A}.megatron.tensor_model_parallel_size", f"{A}.megatron.pipeline_model_parallel_size",
                f"{A}.ppo_micro_batch_size_per_gpu", "trainer.nnodes / trainer.n_gpus_per_node",
                "trainer.memory_plan.enforce=false"):
        assert key in err, key
    assert "Traceback" not in err
    assert "memory plan does NOT fit" in out


def test_enforce_false_starts_the_refused_run_anyway(run_main):
    code, out, err, entered = run_main("trainer.device=cuda", "trainer.memory_plan.gpu_memory_gib=80",
                                       "trainer.memory_plan.enforce=false")
    assert code == 0 and entered, err
    assert "starting anyway (trainer.memory_plan.enforce=false)" in out and "phase update_actor needs" in out


def test_a_7b_layout_that_fits_starts(run_main):
    # TP=4 on 4 GPUs, parameters and optimizer offloaded between phases, vLLM at 0.4 x 80 GiB
    code, out, err, entered = run_main(
        "trainer.device=cuda", "trainer.memory_plan.gpu_memory_gib=80", "trainer.n_gpus_per_node=4",
        f"{A}.megatron.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", f"{A}.megatron.param_offload=true",
        f"{A}.megatron.optimizer_offload=true")
    assert code == 0 and entered, err
    assert "memory plan fits" in out


def test_cpu_runs_report_the_plan_but_are_never_refused(run_main):
    code, out, err, entered = run_main("trainer.device=cpu", "trainer.memory_plan.gpu_memory_gib=80")
    assert code == 0 and entered, err
    assert "starting anyway (trainer.device=cpu)" in out


def test_gpu_memory_gib_changes_the_verdict(run_main):
    """The key is read: the same 7B layout at TP=4 fits 80 GiB GPUs and not 24 GiB ones."""
    layout = ("trainer.device=cuda", "trainer.n_gpus_per_node=4", f"{A}.megatron.tensor_model_parallel_size=4",
              "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4")
    code, _, err, _ = run_main(*layout, "trainer.memory_plan.gpu_memory_gib=24")
    assert code == 2 and "the GPU has 24 GiB" in err
    assert SKIP_HINT in err
