"""GPU memory of one rank of a Megatron role (actor, reference, critic, distillation teacher,
reward model) and of a vLLM replica.

Bytes per rank, from the model's parameter counts (:mod:`megarl.plan.model_size`) and the
layout (:class:`~megarl.parallel.layout.ParallelLayout`). The model of each term:

* parameters: ``dtype`` bytes x the parameters of the rank's largest pipeline stage
  (``layers/pp`` decoder layers, plus the embedding on the first stage and the LM head on
  the last; tied embeddings sit on both), dense weights / TP, experts / (EP x expert TP).
* gradients: megatron DDP's contiguous buffer, fp32 unless the precision-aware optimizer
  keeps ``main_grads_dtype`` lower (``megarl.workers.megatron.optim.grad_reduce_in_fp32``).
* optimizer (Adam): fp32 main parameters (none when training in fp32) + ``exp_avg`` +
  ``exp_avg_sq`` per parameter, divided by DP x CP (dense) / expert DP under the
  distributed optimizer.
* Megatron's CPU optimizer (``override_optimizer_config.optimizer_cpu_offload``, its
  HybridDeviceOptimizer, with the precision-aware optimizer the config rules require): of the
  rank's optimizer share, the fraction ``f`` (``optimizer_offload_fraction``, by elements) lives in
  host memory for good: fp32 main parameters + ``exp_avg`` + ``exp_avg_sq`` (torch's AdamW, fp32) +
  an fp32 gradient copy, 16 bytes a parameter (page-locked copies of exactly their size:
  megarl.compat.megatron_core.hybrid_optimizer); ``1 - f`` on the GPU: fp32 copies + fp32 moments, 12
  bytes a parameter, plus an fp32 copy of its gradients (4) when ``main_grads_dtype`` is below fp32
  (the hybrid optimizer keeps it from one step to the next). The gradient buffer stays on the GPU.
* activations saved for backward, per token of a micro-batch (``tokens / cp`` per rank),
  2 bytes each (bf16) per decoder layer: attention block = norm input + norm output
  (``/tp`` with sequence parallelism) + q, k, v + attention output (``/tp``); MLP block = norm
  input + norm output + gate/up output + SwiGLU output (``/tp``). An MoE layer's experts see
  ``k x etp / tp`` (sequence parallelism) or ``k`` token copies per token (each token's ``top-k``
  experts; expert-TP ranks gather their TP group's tokens): per copy the permuted hidden state that
  feeds the expert GEMMs (``hidden``, whole on every expert-TP rank) plus its gate/up and SwiGLU
  outputs (``3 x moe_intermediate / etp``); plus the shared expert (``/tp``). Full recompute keeps
  only each layer's input plus one layer's activations. Under 1F1B stage ``i`` holds ``pp - i``
  micro-batches in flight: the first stage ``pp x layers/pp`` layers' worth, the last stage one
  micro-batch's ``layers/pp`` layers and the logits; the peak is the larger of the two.
* the MoE token dispatcher's buffers, while one layer runs (any pass): the all-to-all's send and
  receive copies of the permuted hidden states, ``2 x hidden`` per token copy.
* logits (last stage): ``tokens x vocab/tp`` in bf16 saved + one fp32 working copy (the
  log-softmax), 6 bytes per element (critic: a value head, no vocabulary logits).
* forward-only passes (old log-prob, reference, teacher, reward model): one layer's activations +
  the logits; the actor's old log-prob pass also takes the entropy: 12 bytes per logit; the
  distillation teacher's top-k (forward_kl_topk) takes the log-softmax of its whole vocabulary slice
  in fp32 (10 bytes per logit) and returns ``[tokens, k]`` fp32 log-probs + int64 ids; the reward
  model has a value head, no vocabulary logits.
* the distillation student's forward_kl_topk loss (training): its response positions' logits
  ``[tokens x response share, vocab/tp]`` sliced out in bf16 and their log-softmax in fp32, two fp32
  copies while it is made (10 bytes per logit), plus the teacher's ``[tokens, k]`` inputs.
* Megatron-FSDP (``megatron.use_megatron_fsdp``, ZeRO-3 ``optim_grads_params``): the parameters and
  gradients are sharded like the distributed optimizer's state (dense / DP x CP, experts / expert DP);
  see :func:`fsdp_gathered` for what is held whole for a while.
* host memory (offload): every offloaded byte has an exact page-locked host copy for the run
  (megarl.workers.megatron.offload), per GPU; the CPU optimizer's part of the state, per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from megarl.parallel.layout import ParallelLayout
from megarl.plan.model_size import ParamCount

__all__ = ["DTYPE_BYTES", "TrainSetup", "RankMemory", "FsdpGathered", "fsdp_gathered", "rank_memory", "activation_bytes",
           "vllm_memory", "VllmMemory"]

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "fp8": 1}
ACT_BYTES = 2  # activations are bf16/fp16 (mixed precision)
LOGIT_BYTES = 2 + 4  # bf16 logits kept for backward + an fp32 copy in the log-softmax
# A forward that also takes the entropy (the actor's old log-probs): bf16 logits, the fp32 copy, its
# exp and the entropy's e * x product (megarl.workers.megatron.vocab_parallel); 12.4 measured at 7B.
LOGIT_BYTES_FORWARD_ENTROPY = 2 + 4 + 4 + 2
# Top-k log-probs over the vocabulary slice (megarl.workers.megatron.vocab_topk._log_softmax): the bf16
# logits, then two fp32 copies at once at each step (the float() copy and its scaled one, the scaled
# one and its shifted one, the shifted one and the log-softmax).
LOGIT_BYTES_TOPK = 2 + 4 + 4
TOPK_ENTRY_BYTES = 4 + 8  # one top-k entry: its fp32 log-prob and int64 vocabulary id


@dataclass(frozen=True)
class TrainSetup:
    """What a role's memory depends on besides the model and layout.

    ``tokens``: tokens of one training micro-batch on one DP rank (before CP);
    ``forward_tokens``: the same for forward-only passes (log-prob).
    """

    dtype: str  # megatron.dtype resolved: float32 | bfloat16 | float16
    trainable: bool
    tokens: int
    forward_tokens: int
    sequence_parallel: bool = False
    recompute_full: bool = False
    distributed_optimizer: bool = True
    main_grads_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    value_head: bool = False  # critic: [h] -> 1 instead of the LM head
    forward_entropy: bool = False  # the forward pass also computes the entropy (the actor's old log-probs)
    forward_topk: int = 0  # the forward pass takes the top-k log-probs per token (the distillation teacher's)
    loss_topk: int = 0  # the training loss is forward_kl_topk against the teacher's top-k (the distillation student's)
    response_share: float = 1.0  # response positions per token of a micro-batch (forward_kl_topk reads them alone)
    cpu_offload_fraction: float = 0.0  # Megatron's CPU optimizer: the share of the optimizer state in host memory
    megatron_fsdp: bool = False  # Megatron-FSDP: parameters and gradients sharded over DP too


@dataclass(frozen=True)
class RankMemory:
    """Bytes on one rank. ``optimizer_sharded`` = with the distributed optimizer's DP
    sharding, ``optimizer_full`` = without; ``optimizer`` is the configured one, on the GPU;
    ``optimizer_host``: what Megatron's CPU optimizer keeps in host memory for the rank's process."""

    params: int
    grads: int
    optimizer: int
    optimizer_full: int
    optimizer_sharded: int
    activations_train: int
    activations_forward: int
    optimizer_host: int = 0
    fsdp: FsdpGathered | None = None  # Megatron-FSDP's whole-held parameters; None under DDP
    train_peak_stage: str = ""  # pp > 1: the pipeline stage whose activations are activations_train ("first" | "last")

    @property
    def resident(self) -> int:
        """Parameters, gradients and optimizer state (what stays between phases unless offloaded)."""
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class FsdpGathered:
    """What Megatron-FSDP holds whole (all-gathered over DP) on one rank for a while, bytes.

    ``layers``: the transformer layers gathered during a forward or backward pass; ``layer_grads``: their
    unsharded gradients before the reduce-scatter (backward only); ``model``: the rank's whole TP-local
    stage while ``unsharded_params`` holds it (HF export, weight sync), beside the shards."""

    layers: int
    layer_grads: int
    model: int


GATHERED_LAYERS = 2  # the layer running and the next one being prefetched


def fsdp_gathered(p: ParamCount, layout: ParallelLayout, setup: TrainSetup) -> FsdpGathered:
    """Megatron-FSDP's transient whole parameters. Assumption: megatron-core 0.19's FSDP units are the
    transformer layers, gathered one at a time with the next one prefetched, so
    :data:`GATHERED_LAYERS` of the largest layer's TP-local parameters (dense / TP, this rank's experts /
    (EP x expert TP)) are whole at once, and in backward as many unsharded gradients
    (``main_grads_dtype``) wait for their reduce-scatter. The embedding and LM head, outside any unit,
    are not counted as gathered. ``model`` = the stage's TP-local parameters (as DDP holds them)."""
    s = p.shape
    attention = max(p.attention_and_norms if p.softmax_layers else 0,
                    p.linear_attention_and_norms if s.linear_layers else 0, p.mamba_and_norms)
    dense_mlp = p.dense_mlp / layout.tp
    moe_mlp = p.moe_shared / layout.tp + s.experts * p.expert / (layout.ep * layout.etp)
    layer = attention / layout.tp + max((dense_mlp,) * bool(p.dense_layers) + (moe_mlp,) * bool(s.moe_layers))
    dense, expert = _stage_params(p, layout, setup.value_head)
    grads = GATHERED_LAYERS * layer * DTYPE_BYTES[setup.main_grads_dtype] if setup.trainable else 0
    return FsdpGathered(layers=int(GATHERED_LAYERS * layer * DTYPE_BYTES[setup.dtype]), layer_grads=int(grads),
                        model=int((dense + expert) * DTYPE_BYTES[setup.dtype]))


def _stage_params(p: ParamCount, layout: ParallelLayout, value_head: bool) -> tuple[float, float]:
    """(dense, expert) parameters of the largest pipeline stage on one rank."""
    s = p.shape
    per_stage = -(-s.layers // layout.pp)
    share = per_stage / s.layers
    layers_dense = p.attention_params + p.dense_layers * p.dense_mlp + s.moe_layers * p.moe_shared
    head = s.hidden if value_head else (p.lm_head or p.embedding)
    if layout.pp == 1:
        ends = p.embedding + (s.hidden if value_head else p.lm_head) + p.final_norm
    else:  # the larger of the first stage (embedding) and the last (head + final norm)
        ends = max(p.embedding, head + p.final_norm)
    dense = (layers_dense * share + ends) / layout.tp
    expert = p.expert_params * share / (layout.ep * layout.etp)
    return dense, expert


def activation_bytes(p: ParamCount, layout: ParallelLayout, setup: TrainSetup, tokens: int, *, train: bool,
                     stage: str = "last") -> int:
    """Activation bytes on one rank for a micro-batch of ``tokens`` (see the module docstring). ``stage``
    (training with pp > 1): the ``"first"`` or the ``"last"`` pipeline stage's."""
    s = p.shape
    t = tokens / layout.cp
    tp, etp = layout.tp, layout.etp
    norm_div = tp if setup.sequence_parallel else 1
    q_k = (s.heads + s.kv_heads) * s.head_dim  # q, k
    v_out = (s.kv_heads + s.heads) * s.v_dim  # v, attention output
    gate = s.heads * s.head_dim if s.attention_gate else 0
    attention = 2 * s.hidden / norm_div + (q_k + v_out + gate) / tp
    # gated DeltaNet: q/k/v before and after the convolution, z, its output and gated norm
    qkv = 2 * s.linear_key_dim + s.linear_value_dim
    linear = 2 * s.hidden / norm_div + (2 * qkv + 3 * s.linear_value_dim) / tp
    # Mamba-2: its input projection's output (z, x, B, C, dt), the convolution's, the scan's, the gated norm's in/out
    mamba = 2 * s.hidden / norm_div + (2 * (2 * s.mamba_inner + 2 * s.mamba_bc) + s.mamba_heads + 3 * s.mamba_inner) / tp
    attention = (p.softmax_layers * attention + s.linear_layers * linear + s.mamba_layers * mamba) / s.layers
    mlp = 3 if s.gated_mlp else 2  # saved per MLP: input, (gate,) up, activation
    dense_mlp = 2 * s.hidden / norm_div + mlp * s.ffn / tp
    copies = s.experts_per_token * etp / norm_div  # expert token copies on this rank per token
    moe_mlp = 2 * s.hidden / norm_div + copies * (s.hidden + mlp * s.expert_ffn / etp) + mlp * s.shared_expert_ffn / tp
    dispatcher = 2 * copies * s.hidden if s.moe_layers else 0
    dense_layers = p.dense_layers
    per_layer_avg = attention + (dense_layers * dense_mlp + s.moe_layers * moe_mlp) / s.layers
    per_layer_max = attention + max((moe_mlp,) * bool(s.moe_layers) + (dense_mlp,) * bool(dense_layers))
    logit_bytes = LOGIT_BYTES
    if not train and setup.forward_entropy:
        logit_bytes = LOGIT_BYTES_FORWARD_ENTROPY
    elif not train and setup.forward_topk:
        logit_bytes = LOGIT_BYTES_TOPK
    logits = 0 if setup.value_head else t * s.vocab / tp * logit_bytes
    if not train:
        return int(t * (per_layer_max + dispatcher) * ACT_BYTES + logits + t * setup.forward_topk * TOPK_ENTRY_BYTES)
    if setup.loss_topk:
        logits += t * setup.response_share * (s.vocab / tp * LOGIT_BYTES_TOPK + setup.loss_topk * TOPK_ENTRY_BYTES)
    stage_layers = -(-s.layers // layout.pp)

    def stage_bytes(micro_batches: int) -> float:
        """Saved activations of a stage holding `micro_batches` in flight, bytes."""
        layers = micro_batches * stage_layers
        elems = layers * s.hidden / norm_div + per_layer_max if setup.recompute_full else layers * per_layer_avg
        return t * (elems + dispatcher) * ACT_BYTES

    first, last = stage_bytes(layout.pp), stage_bytes(1) + logits  # one stage when pp = 1: both terms at once
    return int(first if layout.pp > 1 and stage == "first" else last)


def rank_memory(p: ParamCount, layout: ParallelLayout, setup: TrainSetup) -> RankMemory:
    """Memory of one rank of a Megatron role (see the module docstring for each term)."""
    dense, expert = _stage_params(p, layout, setup.value_head)
    n = dense + expert
    share_sharded = dense / (layout.dp * layout.cp) + expert / layout.expert_dp
    held = share_sharded if setup.megatron_fsdp else n  # parameters and gradients on the rank between passes
    params = int(held * DTYPE_BYTES[setup.dtype])
    grads = optimizer_full = optimizer_sharded = optimizer = optimizer_host = 0
    if setup.trainable:
        grads = int(held * DTYPE_BYTES[setup.main_grads_dtype])
        main = 0 if setup.dtype == "float32" else 4
        per_param = main + DTYPE_BYTES[setup.exp_avg_dtype] + DTYPE_BYTES[setup.exp_avg_sq_dtype]
        share_full = n
        f = setup.cpu_offload_fraction
        host_per_param = 0
        if f:  # Megatron's CPU optimizer (precision-aware): fp32 copies and moments on either side
            host_per_param = f * (4 + 4 + 4 + 4)  # main params, exp_avg, exp_avg_sq, gradient copy
            per_param = (1 - f) * (4 + 4 + 4 + (4 if setup.main_grads_dtype != "fp32" else 0))
        optimizer_full = int(share_full * per_param)
        optimizer_sharded = int(share_sharded * per_param)
        optimizer = optimizer_sharded if setup.distributed_optimizer else optimizer_full
        optimizer_host = int((share_sharded if setup.distributed_optimizer else share_full) * host_per_param)
    activations_train, peak_stage = _train_activations(p, layout, setup) if setup.trainable else (0, "")
    return RankMemory(
        params=params, grads=grads, optimizer=optimizer, optimizer_full=optimizer_full,
        optimizer_sharded=optimizer_sharded, optimizer_host=optimizer_host,
        fsdp=fsdp_gathered(p, layout, setup) if setup.megatron_fsdp else None,
        activations_train=activations_train,
        activations_forward=activation_bytes(p, layout, setup, setup.forward_tokens, train=False),
        train_peak_stage=peak_stage,
    )


def _train_activations(p: ParamCount, layout: ParallelLayout, setup: TrainSetup) -> tuple[int, str]:
    """(training activation bytes, the pipeline stage they are: "first", pp micro-batches in flight under
    1F1B, or "last", one and the logits; "" without pipeline parallelism)."""
    if layout.pp == 1:
        return activation_bytes(p, layout, setup, setup.tokens, train=True), ""
    first, last = (activation_bytes(p, layout, setup, setup.tokens, train=True, stage=s) for s in ("first", "last"))
    return (first, "first") if first >= last else (last, "last")


@dataclass(frozen=True)
class VllmMemory:
    """One vLLM rank: its budget (``gpu_memory_utilization`` x GPU), weights and the KV cache left."""

    budget: int
    weights: int
    kv_cache: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int = 0  # Mamba-2 layers' state (Nemotron-H), held in the same pool

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds beside one sequence's state."""
        room = max(0, self.kv_cache - self.state_bytes_per_sequence)
        return room // self.kv_bytes_per_token if self.kv_bytes_per_token else 0


def vllm_memory(p: ParamCount, tp: int, dtype: str, gpu_bytes: int, utilization: float) -> VllmMemory:
    """vLLM at tensor-parallel size ``tp``: weights / tp; KV cache = budget - weights (vLLM's
    own activation and CUDA-graph memory are not counted, so the KV figure is an upper bound).
    KV per token = softmax-attention layers (Qwen3.5's gated DeltaNet layers keep a fixed state per sequence
    instead; Nemotron-H's Mamba-2 layers one too, counted per sequence: its convolution's last ``conv_kernel - 1``
    inputs in ``dtype`` and the SSM state, ``mamba_ssm_cache_dtype``) x (k + v: 2 x kv heads (at least one per rank) x head_dim; multi-latent
    attention: the latent and rotary key, ``kv_lora_rank + qk_rope_head_dim``, on every rank)
    x dtype bytes."""
    s = p.shape
    budget = int(gpu_bytes * utilization)
    weights = int(p.total / tp * DTYPE_BYTES[dtype])
    per_layer = s.kv_lora_rank + s.qk_rope_head_dim if s.mla else max(1, s.kv_heads // tp) * (s.head_dim + s.v_dim)
    kv_per_token = p.softmax_layers * per_layer * DTYPE_BYTES[dtype]  # gated DeltaNet, Mamba: a state, no KV
    # Mamba-2: per sequence, the convolution's last width - 1 inputs and the SSM state of this rank's heads
    conv = (s.mamba_inner + 2 * s.mamba_bc) // tp * (s.mamba_conv - 1) * DTYPE_BYTES[dtype]
    ssm = s.mamba_inner // tp * s.mamba_state * DTYPE_BYTES[s.mamba_ssm_cache_dtype]
    return VllmMemory(budget=budget, weights=weights, kv_cache=max(0, budget - weights), kv_bytes_per_token=kv_per_token,
                      state_bytes_per_sequence=s.mamba_layers * (conv + ssm))
