"""Megatron-Bridge 0.6.2 (verl 0.9.1's HF <-> Megatron bridge) beside megarl's converters, on CPU without TE.

* Importing it (megarl.compat.megatron_bridge.auto_bridge) leaves transformer-engine absent for
  everyone: nothing under ``transformer_engine`` in sys.modules, megarl's detection, megatron-core's and the
  bridge's own ``HAVE_TE`` all False, the layer spec still the local one.
* For the families both convert, the bridge's HF -> Megatron load into megarl's model (local spec, TP=1)
  equals megarl's own load bitwise, tensor by tensor, and its Megatron -> HF export equals the HF
  checkpoint bitwise (megarl's export is held to the same file by tests/models/test_megatron_vs_hf.py):
  Qwen2, Llama, Qwen3, GPT-OSS (sinks, biased experts stacked per layer: the bridge's own GPT-OSS mapping
  checks megarl's stacked-expert layouts) and Qwen3.5 text (gated DeltaNet and gated attention; the bridge keeps
  the DeltaNet's output norm zero-centred, megarl as HF plain) here; tied Qwen2, Qwen3-MoE, DeepSeek-V3 (MLA),
  Qwen3.5-MoE and Qwen3-Next (key-head-grouped DeltaNet projections; the same output norm) with ``-m extended``. Not equal,
  2026-11-26: GLM-4.5 (the bridge's load finds no mapping for a parameter of megarl's local-spec model:
  ``'NoneType' object has no attribute 'megatron_module'``) and Gemma 3 (megarl's own Gemma 3 layers,
  e.g. ``mlp.post_feedforward_layernorm``, are not the bridge's Gemma 3 model).
* The family only the bridge covers (the verl-scripts issue's Nemotron-H)
  and the two only megarl covers (Mixtral, Qwen2-MoE) are what the docs say.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.dist_utils import run_distributed

_TE_ABSENT = """
import importlib.util, json, sys
import megatron.core.extensions.transformer_engine as mcore_te
from megarl.compat.megatron_bridge import auto_bridge
auto_bridge()
import megatron.bridge.models.deepseek.deepseek_v3_bridge as deepseek_v3_bridge
import torch
from megarl.models.spec import have_transformer_engine, resolve_transformer_impl
print("RESULT" + json.dumps({
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "transformer_engine"),
    "find_spec": importlib.util.find_spec("transformer_engine") is not None,
    "megarl": have_transformer_engine(),
    "megatron_core": bool(mcore_te.HAVE_TE),
    "bridge": bool(deepseek_v3_bridge.HAVE_TE),
    "spec": resolve_transformer_impl("transformer_engine", torch.device("cuda"), have_transformer_engine())[0],
    "bridge_imported": "megatron.bridge" in sys.modules,
}))
"""


def test_transformer_engine_stays_absent_after_importing_the_bridge():
    proc = subprocess.run([sys.executable, "-c", _TE_ABSENT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.split("RESULT")[-1])
    assert got == {"modules": [], "find_spec": False, "megarl": False, "megatron_core": False, "bridge": False,
                   "spec": "local", "bridge_imported": True}


def bridge_vs_megarl(family: str) -> dict:
    """One rank: megarl's engine (local spec) loads ``family``'s tiny checkpoint; the bridge loads it again
    into the zeroed model, then exports it."""
    import os
    import tempfile

    import torch
    from safetensors.torch import load_file

    from hf_tiny import make_tiny_hf
    from helpers.cpu_config import CPU_SMALL
    from megarl.compat.megatron_bridge import auto_bridge
    from megarl.config import load_config, resolve_config
    from megarl.models import unwrap_chunk
    from megarl.workers.megatron.engine import MegatronEngine

    path = make_tiny_hf(family, tempfile.mkdtemp())
    cfg = resolve_config(load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={path}"]))
    engine = MegatronEngine(cfg.actor_rollout_ref.ref.megatron, path, optim_cfg=None, prefix="actor_rollout_ref.ref",
                            device="cpu")
    engine.init_model()
    models = [unwrap_chunk(chunk) for chunk in engine.chunks]

    def state() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for m in models for k, v in m.state_dict().items() if not k.endswith("_extra_state")}

    ours = state()
    bridge_cls = auto_bridge()
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    # megarl's core attention in megatron's slot: GPT-OSS's sinks split over TP by heads, as the bridge maps
    # megatron's DotProductAttention
    AutoMapping.register_module_type("SDPACoreAttention", "column")
    bridge = bridge_cls.from_hf_pretrained(path)
    with torch.no_grad():
        for model in models:
            for param in model.parameters():
                param.zero_()
    bridge.load_hf_weights(models)
    theirs = state()
    hf = load_file(os.path.join(path, "model.safetensors"))
    exported = dict(bridge.export_hf_weights(models, cpu=True, show_progress=False))
    return {
        "tensors": len(ours),
        "load_keys_differ": sorted(set(ours) ^ set(theirs)),
        "load_values_differ": sorted(k for k in ours.keys() & theirs.keys() if not torch.equal(ours[k], theirs[k])),
        # what each differing tensor of the bridge's load is, as megarl's minus 1 (a zero-centred norm's weight)
        "differ_by_one": sorted(k for k in ours.keys() & theirs.keys() if not torch.equal(ours[k], theirs[k])
                                and torch.allclose(ours[k] - 1, theirs[k])),
        "export_keys_differ": sorted(set(hf) ^ set(exported)),
        "export_values_differ": sorted(k for k in hf.keys() & exported.keys()
                                       if not torch.equal(hf[k], exported[k].to(hf[k].dtype))),
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3", "gpt_oss", "qwen3_5",
                                    *(pytest.param(f, marks=pytest.mark.extended)
                                      for f in ("qwen2_tied", "qwen3_moe", "deepseek_v3", "qwen3_5_moe", "qwen3_next"))])
def test_bridge_load_and_export_equal_megarl_bitwise(family):
    got = run_distributed(bridge_vs_megarl, 1, family, timeout=600)[0]
    assert got["tensors"] > 20
    # Qwen3.5: the bridge builds every norm zero-centred (layernorm_zero_centered_gamma), the gated DeltaNet's output
    # norm too, so it stores HF's weight - 1 there; megarl's is a plain RMSNorm holding HF's weight (HF's is plain)
    deltanets = {"qwen3_5": 2, "qwen3_5_moe": 2, "qwen3_next": 3}.get(family, 0)  # gated DeltaNet layers of the tiny model
    shifted = [k for k in got["load_values_differ"] if k.endswith("self_attention.out_norm.weight")]
    assert got == {"tensors": got["tensors"], "load_keys_differ": [], "load_values_differ": shifted,
                   "differ_by_one": shifted, "export_keys_differ": [], "export_values_differ": []}
    assert len(shifted) == deltanets


def test_families_only_one_of_the_two_covers():
    from megarl.compat.megatron_bridge import auto_bridge
    from megarl.models.config import SUPPORTED_MODEL_TYPES

    bridge = set(auto_bridge().list_supported_models())
    assert {"GptOssForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM",
            "NemotronHForCausalLM"} <= bridge
    assert {"gpt_oss", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "nemotron_h"} <= set(SUPPORTED_MODEL_TYPES)
    # megarl keeps its converters for these (megarl/models/converters/__init__.py)
    assert not {"MixtralForCausalLM", "Qwen2MoeForCausalLM"} & bridge
    assert {"mixtral", "qwen2_moe"} <= set(SUPPORTED_MODEL_TYPES)
