"""RolloutWorker's config -> vLLM engine / sampling arguments (no engine started)."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_hf import actor_rollout_ref_config, build_tiny_qwen2

from megarl.workers.rollout import RolloutConfigError, RolloutWorker, read_special_token_ids


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("cfg_qwen2"), eos_token_id=7)


def _worker(hf_dir, **overrides):
    """A RolloutWorker shell with config only: _engine_kwargs / sampling_params need no engine."""
    worker = object.__new__(RolloutWorker)
    worker.config = actor_rollout_ref_config(hf_dir, 8, 6, **overrides)
    worker.rollout_cfg = worker.config.rollout
    worker.hf_dir = str(hf_dir)
    worker.pad_token_id, worker.eos_token_ids = read_special_token_ids(str(hf_dir))
    worker.calculate_log_probs = True
    worker.free_cache_engine = True
    return worker


def test_engine_kwargs_from_config(hf_dir):
    kw = _worker(hf_dir, **{
        "rollout.load_format": "dummy_megatron", "rollout.dtype": "fp32", "rollout.max_num_seqs": 3,
        "rollout.engine_kwargs.vllm": {"swap_space": 2, "block_size": None},
    })._engine_kwargs()
    assert kw["load_format"] == "dummy" and kw["dtype"] == "float32"
    assert kw["max_model_len"] == 14  # prompt_length + response_length when null
    assert kw["max_num_seqs"] == 3 and kw["skip_tokenizer_init"] is True
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["swap_space"] == 2 and "block_size" not in kw  # engine_kwargs.vllm passed through, nulls dropped
    assert kw["enable_prefix_caching"] is True  # verl's default
    assert _worker(hf_dir, **{"rollout.enable_prefix_caching": False})._engine_kwargs()["enable_prefix_caching"] is False


def test_bad_engine_config_names_the_key(hf_dir):
    with pytest.raises(RolloutConfigError, match="rollout.max_model_len=10"):
        _worker(hf_dir, **{"rollout.max_model_len": 10})._engine_kwargs()
    with pytest.raises(RolloutConfigError, match="rollout.max_num_batched_tokens=8 must be >= max_model_len"):
        _worker(hf_dir, **{"rollout.max_num_batched_tokens": 8, "rollout.enable_chunked_prefill": False})._engine_kwargs()


def test_sampling_params_train_greedy_and_validation(hf_dir):
    worker = _worker(hf_dir, **{"rollout.n": 4, "rollout.temperature": 0.6, "rollout.top_k": 5,
                                "rollout.top_p": 0.9, "rollout.val_kwargs.temperature": 0.3,
                                "rollout.val_kwargs.do_sample": True, "rollout.val_kwargs.n": 2})
    train = worker.sampling_params(validate=False, do_sample=True)
    assert (train.n, train.temperature, train.top_k, train.top_p, train.max_tokens) == (4, 0.6, 5, 0.9, 6)
    assert train.stop_token_ids == [7] and train.logprobs == 0
    greedy = worker.sampling_params(validate=False, do_sample=False)
    assert greedy.temperature == 0.0 and greedy.n == 1
    val = worker.sampling_params(validate=True, do_sample=True)
    assert (val.n, val.temperature, val.top_k) == (2, 0.3, 0)  # val top_k -1 -> vLLM's 0 (off)
    ignore = _worker(hf_dir, **{"rollout.ignore_eos": True}).sampling_params(validate=False, do_sample=True)
    assert ignore.ignore_eos and ignore.stop_token_ids == []


def test_engine_seed_is_rollout_seed_plus_replica(hf_dir, monkeypatch):
    assert _worker(hf_dir, **{"rollout.seed": 7})._engine_kwargs()["seed"] == 7  # no world: one replica
    with pytest.raises(RolloutConfigError, match="engine_kwargs.vllm.seed is not accepted: set actor_rollout_ref.rollout.seed"):
        _worker(hf_dir, **{"rollout.engine_kwargs.vllm": {"seed": 3}})._engine_kwargs()
    # rank 3 of a 4-rank world at rollout TP=2 is in replica 1 (ranks 2, 3 share its seed)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    kw = _worker(hf_dir, **{"rollout.seed": 7, "rollout.tensor_model_parallel_size": 2})._engine_kwargs()
    assert kw["seed"] == 8 and kw["distributed_executor_backend"] == "external_launcher"


def test_rollout_expert_parallel_size_shards_the_experts(hf_dir, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # rank 0 of one TP=2 replica
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    assert _worker(hf_dir)._engine_kwargs()["enable_expert_parallel"] is False
    kw = _worker(hf_dir, **{"rollout.expert_parallel_size": 2, "rollout.tensor_model_parallel_size": 2})._engine_kwargs()
    assert kw["enable_expert_parallel"] is True and kw["tensor_parallel_size"] == 2
    for name, key in (("enable_expert_parallel", "expert_parallel_size"), ("data_parallel_size", "data_parallel_size")):
        with pytest.raises(RolloutConfigError, match=f"engine_kwargs.vllm.{name} is not accepted: set actor_rollout_ref.rollout.{key}"):
            _worker(hf_dir, **{"rollout.engine_kwargs.vllm": {name: 2}})._engine_kwargs()
