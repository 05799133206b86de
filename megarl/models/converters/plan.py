"""Where every HF parameter lives in a megatron layout (TP/PP/VPP/EP), in export order.

Pure: computed from the HF config and the model's ``TransformerConfig`` (which carries
the parallel sizes), with no process groups. ``load_hf_weights`` keeps the entries of the
local rank; ``export_hf_weights`` walks all entries in this order on every rank; weight
sync can use the same list to plan buckets and resharding.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from megarl.models.converters.tables import Rule, arch_tables
from megarl.models.converters.transforms import Dims

__all__ = ["ParamSource", "build_plan", "dims_of"]


@dataclass(frozen=True)
class ParamSource:
    """One megatron parameter, where it lives and which HF parameters it holds.

    Attributes:
        hf_names: full HF names, in the order the layout kind fuses them
            (q, k, v for ``qkv``; gate, up for ``gate_up``).
        mcore_name: parameter name inside its GPTModel chunk (local layer and expert index).
        kind: layout kind (``megarl.models.converters.transforms``): how the TP shards
            of the megatron parameter relate to the HF tensors.
        pp_rank: pipeline rank holding it; vp_stage: chunk index on that rank.
        ep_rank: expert-parallel rank holding it (experts only; None = every EP rank).
        tp_group: ``"tp"`` (tensor parallel) or ``"etp"`` (expert tensor parallel): the
            group its shards are split over.
        layer: global decoder layer index (None for embedding/final norm/head).
        expert: global expert index (None for non-expert parameters).
        export: False for a tied LM head's copy of the embedding (exported once).
        stacked: > 0 when the HF tensor holds all ``stacked`` experts of the layer along dim 0
            (``ArchTables.stacked_experts``): then ``mcore_name`` keeps an ``{expert}`` field for the
            local expert index, every EP rank holds ``stacked / EP`` of them (``ep_rank`` None,
            ``expert`` None) and ``kind`` is the layout of one expert's slice.
    """

    hf_names: tuple[str, ...]
    mcore_name: str
    kind: str
    pp_rank: int
    vp_stage: int
    ep_rank: int | None = None
    tp_group: str = "tp"
    layer: int | None = None
    expert: int | None = None
    export: bool = True
    stacked: int = 0


def dims_of(hf_config) -> Dims:
    """Sizes the layout transforms need, from the HF config."""
    heads = hf_config.num_attention_heads
    return Dims(
        num_heads=heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        vocab_size=hf_config.vocab_size,
        gdn_key_dim=(getattr(hf_config, "linear_num_key_heads", 0) or 0) * (getattr(hf_config, "linear_key_head_dim", 0) or 0),
        gdn_value_dim=((getattr(hf_config, "linear_num_value_heads", 0) or 0)
                       * (getattr(hf_config, "linear_value_head_dim", 0) or 0)),
        gdn_key_heads=getattr(hf_config, "linear_num_key_heads", 0) or 0,
        gdn_value_heads=getattr(hf_config, "linear_num_value_heads", 0) or 0,
        mamba_inner=(getattr(hf_config, "mamba_num_heads", 0) or 0) * (getattr(hf_config, "mamba_head_dim", 0) or 0),
        mamba_bc=(getattr(hf_config, "n_groups", 0) or 0) * (getattr(hf_config, "ssm_state_size", 0) or 0),
        mamba_heads=getattr(hf_config, "mamba_num_heads", 0) or 0,
    )


def _entry(rule: Rule, pp_rank: int, vp_stage: int, **fmt) -> ParamSource:
    local = {k: v for k, v in fmt.items() if k.startswith("local_")}
    glob = {k: v for k, v in fmt.items() if not k.startswith("local_")}
    return ParamSource(
        hf_names=tuple(name.format(**glob) for name in rule.hf),
        mcore_name=rule.mcore.format(**{k[len("local_"):]: v for k, v in local.items()}),
        kind=rule.kind,
        pp_rank=pp_rank,
        vp_stage=vp_stage,
        layer=glob.get("layer"),
    )


def build_plan(hf_config, config: TransformerConfig, *, value_head: bool = False) -> list[ParamSource]:
    """Every megatron parameter of the model, in the deterministic export order.

    Order: chunks in global layer order (vp stage major, then pipeline rank), within a
    chunk embedding, then per layer the layer rules (attention, then the dense MLP or the
    MoE router and shared expert) followed by a MoE layer's experts in global expert order,
    then final norm and head.
    """
    tables = arch_tables(hf_config, value_head=value_head)
    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    ep = config.expert_model_parallel_size
    num_experts = config.num_moe_experts or 0
    if num_experts % ep:
        raise ValueError(
            f"num_experts={num_experts} is not divisible by megatron.expert_model_parallel_size={ep}"
        )
    local_experts = num_experts // ep if num_experts else 0

    plan: list[ParamSource] = []
    for vp_stage in range(vpp):
        for pp_rank in range(pp):
            stage = vp_stage if config.virtual_pipeline_model_parallel_size else None
            first = pp_rank == 0 and vp_stage == 0
            last = pp_rank == pp - 1 and vp_stage == vpp - 1
            if first:
                plan += [_entry(rule, pp_rank, vp_stage) for rule in tables.first]
            offset = get_transformer_layer_offset(config, vp_stage=stage, pp_rank=pp_rank)
            count = get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
            for local_layer in range(count):
                layer = offset + local_layer
                is_moe = bool(tables.moe_pattern) and tables.moe_pattern[layer] == 1
                linear = bool(tables.linear_pattern) and tables.linear_pattern[layer] == 1
                rules = (tables.per_layer[layer] if tables.per_layer else
                         (tables.linear_layer if linear else tables.layer) + (tables.moe if is_moe else tables.dense_mlp))
                plan += [_entry(rule, pp_rank, vp_stage, layer=layer, local_layer=local_layer) for rule in rules]
                if is_moe and tables.stacked_experts:
                    plan += [ParamSource(**{**_entry(rule, pp_rank, vp_stage, layer=layer, local_layer=local_layer,
                                                     local_expert="{expert}").__dict__,
                                            "tp_group": "etp", "stacked": num_experts})
                             for rule in tables.expert]
                    continue
                for expert in range(num_experts if is_moe else 0):
                    for rule in tables.expert:
                        entry = _entry(
                            rule, pp_rank, vp_stage,
                            layer=layer, local_layer=local_layer,
                            expert=expert, local_expert=expert % local_experts,
                        )
                        plan.append(
                            ParamSource(
                                **{**entry.__dict__,
                                   "ep_rank": expert // local_experts,
                                   "tp_group": "etp",
                                   "expert": expert}
                            )
                        )
            if last:
                plan += [_entry(rule, pp_rank, vp_stage) for rule in tables.last]
                if tables.tied_output is not None and not first:
                    tied = _entry(tables.tied_output, pp_rank, vp_stage)
                    plan.append(ParamSource(**{**tied.__dict__, "export": False}))
    return plan
