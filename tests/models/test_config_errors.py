"""Bad configuration gives errors that name the key (no processes)."""

from __future__ import annotations

import pytest
import torch
import transformers

from megarl.models.config import hf_to_transformer_config, padded_vocab_size


def test_unsupported_architecture_names_model_type():
    config = transformers.GPT2Config()
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        hf_to_transformer_config(config, {}, device="cpu", dtype=torch.float32)


def test_padded_vocab_size():
    assert padded_vocab_size(96, 2) == 96
    assert padded_vocab_size(97, 2) == 98
    assert padded_vocab_size(97, 4) == 100


@pytest.mark.parametrize("name", ["flash", "fused", "unfused", "local", "auto"])
def test_attention_backend_reaches_megatron_as_its_enum(name):
    from megatron.core.transformer.enums import AttnBackend

    from megarl.models.config import transformer_overrides

    got = transformer_overrides({"attention_backend": name, "recompute_granularity": None})
    assert got == {"attention_backend": AttnBackend[name], "recompute_granularity": None}
    with pytest.raises(ValueError, match="recompute_granularty"):
        transformer_overrides({"recompute_granularty": "full"})
