"""Bad configuration gives errors that name the key (no processes)."""

from __future__ import annotations

import pytest
import torch
import transformers

from megarl.models.config import hf_to_transformer_config, padded_vocab_size
from megarl.parallel import parallel_sizes


def test_parallel_sizes_defaults_and_bad_value():
    assert parallel_sizes({"tensor_model_parallel_size": 2}) == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": None,
    }
    with pytest.raises(ValueError, match="megatron.pipeline_model_parallel_size"):
        parallel_sizes({"pipeline_model_parallel_size": 0})


def test_unsupported_architecture_names_model_type():
    config = transformers.GPT2Config()
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        hf_to_transformer_config(config, {}, device="cpu", dtype=torch.float32)


def test_padded_vocab_size():
    assert padded_vocab_size(96, 2) == 96
    assert padded_vocab_size(97, 2) == 98
    assert padded_vocab_size(97, 4) == 100
