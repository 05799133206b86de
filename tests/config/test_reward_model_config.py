"""reward.reward_model: verl's keys validated up front, mapped onto the Megatron worker, legacy keys moved."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues, write_model

RM = "reward.reward_model"


@pytest.fixture
def rm_on(make, tmp_path):
    """make() with a reward model enabled on a one-label model dir (TP 1: the CPU world has 1 rank)."""
    write_model(tmp_path / "rm", architectures=["Qwen2ForSequenceClassification"], id2label={"0": "LABEL_0"})
    (tmp_path / "rm" / "tokenizer_config.json").write_text("{}")  # only its presence is checked before workers start

    def _make(overrides: dict | None = None, **hf):
        if hf:
            write_model(tmp_path / "rm", **hf)
        return make({f"{RM}.enable": True, f"{RM}.model_path": str(tmp_path / "rm"), f"{RM}.rollout.name": "vllm",
                     f"{RM}.rollout.tensor_model_parallel_size": 1, **(overrides or {})})

    return _make


def test_enabled_reward_model_validates_and_types(rm_on, tmp_path):
    from megarl.config.read import typed_config

    cfg = rm_on({f"{RM}.rollout.max_num_seqs": 7, f"{RM}.rollout.dtype": "float32"})
    no_issues(cfg)
    rm = typed_config(cfg).reward.reward_model
    assert rm.enable and rm.model_path == str(tmp_path / "rm") and rm.rollout.max_num_seqs == 7
    assert rm.rollout.max_length() == 2048 + 2048  # verl's server: prompt_length + response_length
    rm.rollout.max_model_len = 100
    assert rm.rollout.max_length() == 100


def test_rollout_keys_map_onto_the_megatron_layout(rm_on):
    from megarl.config.read import typed_config
    from megarl.workers.reward_model import reward_model_megatron

    cfg = rm_on({f"{RM}.rollout.pipeline_model_parallel_size": 2, f"{RM}.rollout.dtype": "float16",
                 f"{RM}.rollout.free_cache_engine": False})
    m = reward_model_megatron(typed_config(cfg).reward.reward_model.rollout)
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.dtype, m.param_offload) == (1, 2, "float16", False)


def test_what_megarl_cannot_honour_is_refused_naming_the_key(rm_on, make, tmp_path):
    issue_for(make({f"{RM}.enable": True}), f"{RM}.model_path", "no model directory")
    issue_for(make({f"{RM}.enable": True}), f"{RM}.rollout.name", "vllm")  # verl's mandatory ???
    issue_for(rm_on({f"{RM}.rollout.name": "sglang"}), f"{RM}.rollout.name", "not supported", "vllm")
    issue_for(rm_on({f"{RM}.enable_resource_pool": True}), f"{RM}.enable_resource_pool", "colocates")
    issue_for(rm_on({f"{RM}.rollout.data_parallel_size": 2}), f"{RM}.rollout.data_parallel_size", "not supported")
    issue_for(rm_on({f"{RM}.rollout.tensor_model_parallel_size": 2}), f"{RM}.rollout.tensor_model_parallel_size",
              "does not divide the trainer world")
    issue_for(rm_on({"reward.custom_reward_function.path": __file__}), f"{RM}.enable", "custom_reward_function.path")
    issue_for(rm_on({"reward.launch_reward_fn_async": True}), "reward.launch_reward_fn_async", "replaces the rule reward")
    issue_for(rm_on(id2label={"0": "a", "1": "b"}), f"{RM}.model_path", "2 labels", "num_labels=1")
    issue_for(rm_on(model_type="gpt2"), f"{RM}.model_path", "not supported")
    (tmp_path / "rm" / "tokenizer_config.json").unlink()
    issue_for(rm_on(model_type="qwen2"), f"{RM}.model_path", "has no tokenizer", "save_pretrained")


def test_legacy_reward_model_keys_move_to_reward_reward_model():
    """verl's migrate_legacy_reward_impl: reward_model.{enable, model.path, rollout.*, ...} -> reward.reward_model.*."""
    from megarl.config import load_config

    cfg = load_config(["actor_rollout_ref.model.path=/placeholder", "reward_model.enable=true",
                       "reward_model.model.path=/rm", "reward_model.rollout.tensor_model_parallel_size=1",
                       "reward_model.rollout.name=vllm", "reward_model.n_gpus_per_node=4"])
    rm = cfg.reward.reward_model
    assert (rm.enable, rm.model_path, rm.rollout.tensor_model_parallel_size, rm.rollout.name, rm.n_gpus_per_node) == (
        True, "/rm", 1, "vllm", 4)
    assert cfg.reward_model.model.path is None and cfg.reward_model.rollout.tensor_model_parallel_size is None


def test_rows_without_ground_truth_pass_preflight_when_the_reward_model_scores(rm_on, tmp_path):
    """The rule scorers need reward_model.ground_truth and a known data_source; the reward model neither."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megarl.preflight.data import data_issues
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    rows = [{"data_source": "chat", "prompt": [{"role": "user", "content": "1+2"}], "reward_model": None,
             "extra_info": {"index": i}} for i in range(16)]
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "rlhf.parquet"))
    files = {"data.train_files": str(tmp_path / "rlhf.parquet")}
    tok = build_demo_tokenizer()
    off = rm_on({**files, f"{RM}.enable": False})
    assert [i.key for i in data_issues(off, tok, "train")] == ["data.train_files"]  # no ground truth
    assert data_issues(rm_on(files), tok, "train") == []


def test_reward_model_tp_over_kv_heads(rm_on):
    """TP a multiple of the reward model's KV heads is accepted (replicated, as the actor's), a TP that neither
    divides them nor is a multiple of them is refused by key."""
    from megarl.config import collect_issues
    from megarl.preflight import RUNTIME_RULES

    key = f"{RM}.rollout.tensor_model_parallel_size"
    four = {"trainer.n_gpus_per_node": 4, key: 4}
    assert [i.format() for i in collect_issues(rm_on(four), RUNTIME_RULES) if i.key == key] == []
    issue_for(rm_on({**four, key: 2}, num_attention_heads=6, num_key_value_heads=3, hidden_size=96), key,
              "num_key_value_heads=3", "nor is a multiple")
