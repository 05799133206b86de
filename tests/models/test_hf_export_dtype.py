"""An HF export says the dtype its weights have and is readable by others (issue 37 item 9: the merger
wrote bf16 weights under a config.json saying float32, and the safetensors file with mode 0600)."""

from __future__ import annotations

import json
import stat

import pytest
import torch
from helpers.dist_utils import run_distributed
from hf_tiny import make_tiny_hf
from mcore_body import export_in_dtype
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def test_bf16_export_of_a_float32_config_says_bfloat16_and_is_world_readable(tmp_path):
    model_dir = make_tiny_hf("qwen2_tied", str(tmp_path / "model"))
    assert json.loads((tmp_path / "model" / "config.json").read_text())["dtype"] == "float32"
    out = tmp_path / "hf"
    (result,) = run_distributed(export_in_dtype, 1, model_dir, str(out), "bfloat16", timeout=240)
    assert result["config_dtype_after"] == "torch.float32"  # the caller's config object is not changed
    tensors = load_file(str(out / "model.safetensors"))
    counts: dict[torch.dtype, int] = {}
    for tensor in tensors.values():
        counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
    assert max(counts, key=counts.get) == torch.bfloat16, counts
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, (path.name, oct(path.stat().st_mode))
    original = load_file(f"{model_dir}/model.safetensors")
    assert all(torch.equal(t, original[k].to(t.dtype)) for k, t in tensors.items())  # the weights, rounded once
