"""HF <-> megatron parameter tables, layout transforms and placement plans (one place).

* :mod:`.tables`     - per-architecture rules: megatron name <-> HF name(s), layout kind.
* :mod:`.transforms` - pure HF-full <-> TP-shard functions per layout kind.
* :mod:`.plan`       - every parameter's PP rank / VPP chunk / EP rank, in export order.

mbridge (0.15.1, what verl's ``megatron.use_mbridge`` selects) is the reference these tables are
checked against (``tests/models/test_mbridge_names.py``: for every tensor mbridge names, the same
HF names), not the converter megarl runs, because where megarl needs it, it fails:

* its name maps know only the transformer-engine spelling (norms fused into the next linear,
  grouped experts ``mlp.experts.linear_fc1.weight{e}``); megarl's CPU / no-TE path runs the
  local spec (``input_layernorm``, ``mlp.experts.local_experts.{e}``): every such name raises;
* its Qwen-MoE and Mixtral bridges name no dense-MLP layer of a MoE model (``mlp_only_layers``);
* its loader reads on TP rank 0 and scatters, its exporter walks ``named_parameters`` with
  CUDA-only buffers; megarl's weight sync needs every tensor's placement (PP / VPP / EP / ETP,
  layout kind: :class:`.plan.ParamSource`) ahead of time to bucket and gather straight into vLLM;
* its DeepSeek-V3 bridge cannot be built with megatron-core 0.16.1 / transformers 5 (it passes
  ``max_position_embeddings`` to ``MLATransformerConfig`` and reads ``rope_theta``).

Its config builders are not used either (see :mod:`megarl.models.moe_config`).

Megatron-Bridge 0.6.2 (verl 0.9.1's bridge; :func:`megarl.compat.megatron_bridge.auto_bridge`) converts
Qwen2, Llama, Qwen3, Qwen3-MoE, DeepSeek-V3 and GPT-OSS (whose experts HF stacks in one tensor per layer:
``ArchTables.stacked_experts``) exactly as these tables do: its load into megarl's models and its export
equal megarl's bitwise on CPU (``tests/models/test_megatron_bridge.py``); GLM-4.5 and Gemma 3 it does not
load into megarl's models (see that test). It covers families megarl does not convert (Qwen3-Next, Qwen3.5,
Nemotron-H, DeepSeek-V4, ...). These tables stay because the bridge cannot serve where megarl needs them:

* Mixtral and Qwen2-MoE: the bridge has no bridge for either (``AutoBridge.list_supported_models()``);
* the weight sync needs every tensor's placement (PP / VPP / EP / ETP, layout kind: :class:`.plan.ParamSource`)
  ahead of time, to bucket and gather straight into vLLM's layout; the bridge's export is an iterator over
  whole HF tensors.
"""

from megarl.models.converters.plan import ParamSource, build_plan, dims_of
from megarl.models.converters.tables import TE_ALIASES, ArchTables, Rule, arch_tables
from megarl.models.converters.transforms import Dims, from_shards, is_split, to_shard

__all__ = [
    "ArchTables",
    "Dims",
    "ParamSource",
    "Rule",
    "TE_ALIASES",
    "arch_tables",
    "build_plan",
    "dims_of",
    "from_shards",
    "is_split",
    "to_shard",
]
