"""main_generation / main_eval: verl's configs compose, bad values are named up front, pass@k by hand."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir

from megarl.main_eval import CONFIG_DIR, pass_at_k, summarize
from megarl.main_generation import check


def _generation(tmp_path, *overrides: str):
    (tmp_path / "p.parquet").write_bytes(b"")
    base = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", f"data.path={tmp_path / 'p.parquet'}", f"model.path={tmp_path}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="generation", overrides=[*base, *overrides])


def test_generation_defaults_are_valid_and_bad_values_named(tmp_path):
    assert check(_generation(tmp_path)) == []
    problems = {i.key: i for i in check(_generation(tmp_path, "rollout.temperature=0", "rollout.name=sglang",
                                                      "rollout.load_format=auto", "actor.strategy=megatron",
                                                      "trainer.device=cuda", "trainer.n_gpus_per_node=8"))}
    assert set(problems) == {"data.n_samples", "rollout.name", "rollout.load_format", "actor", "trainer.n_gpus_per_node"}
    assert "set data.n_samples=1" in problems["data.n_samples"].fix
    assert "one vLLM engine" in problems["trainer.n_gpus_per_node"].problem
    assert "leave rollout.load_format at its default" in problems["rollout.load_format"].fix


def test_evaluation_yaml_has_verls_keys():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="evaluation")
    assert set(cfg.data) == {"path", "prompt_key", "response_key", "data_source_key", "reward_model_key"}
    assert cfg.custom_reward_function.name == "compute_score" and cfg.ray_kwargs.ray_init.num_cpus is None


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(4, 2, 4) == 1.0 and pass_at_k(4, 1, 4) == 1.0


def test_summarize_per_source():
    metrics = summarize([("a", [1.0, 0.0, 0.0, 0.0]), ("a", [1.0, 1.0, 0.0, 0.5]), ("b", [0.0, 0.0, 0.0, 0.0])])
    assert metrics == {
        "test_score/a": pytest.approx((0.25 + 0.625) / 2),  # verl: mean over rows of the row means
        "pass@1/a": pytest.approx((0.25 + 0.5) / 2),  # 0.5 is not a full score
        "pass@2/a": pytest.approx((0.5 + (1 - 1 / 6)) / 2),
        "pass@4/a": 1.0,
        "test_score/b": 0.0, "pass@1/b": 0.0, "pass@2/b": 0.0, "pass@4/b": 0.0,
    }
