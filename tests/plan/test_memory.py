"""The memory model on a hand-computed example, and its layout arithmetic."""

from __future__ import annotations

from megarl.parallel.layout import ParallelLayout
from megarl.plan.memory import TrainSetup, rank_memory, vllm_memory
from megarl.plan.model_size import ModelShape, count_params

TINY = count_params(ModelShape.from_hf_config(dict(
    model_type="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)))  # 138304 parameters


def test_hand_computed_rank_memory_dp2():
    setup = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50)
    m = rank_memory(TINY, ParallelLayout(world_size=2), setup)  # TP=1, DP=2
    assert m.params == 2 * 138304  # bf16
    assert m.grads == 4 * 138304  # fp32 main grads
    assert m.optimizer_full == 12 * 138304  # fp32 main params + exp_avg + exp_avg_sq
    assert m.optimizer == m.optimizer_sharded == 12 * 138304 // 2  # distributed optimizer over DP=2
    # per token per layer: attention 2*64 (norm in/out) + 2*64 (q, attn out) + 2*32 (k, v) = 320;
    # MLP 2*64 + 3*128 (gate, up, swiglu out) = 512 -> 832 x 2 layers x 100 tokens x 2 bytes = 332800;
    # logits 100 x 1000 x 6 bytes = 600000
    assert m.activations_train == 332800 + 600000
    # forward only: one layer (832 x 50 x 2 = 83200) + logits 50 x 1000 x 6 = 300000
    assert m.activations_forward == 83200 + 300000


def test_cpu_optimizer_splits_the_state_between_host_and_gpu():
    """Megatron's CPU optimizer at fraction f (precision-aware, DP=2: 69152 parameters in this rank's share):
    f of the share on the host at 16 bytes (fp32 main param, exp_avg, exp_avg_sq, gradient copy), 1 - f on
    the GPU at 12 (fp32 copy, exp_avg, exp_avg_sq) + 4 for an fp32 gradient copy under bf16 main grads;
    the gradient buffer stays whole on the GPU."""
    share = 138304 // 2
    for f, main_grads, gpu_per_param, grad_bytes in ((0.5, "fp32", 6, 4), (0.5, "bf16", 8, 2), (1.0, "fp32", 0, 4),
                                                       (0.25, "fp32", 9, 4)):
        setup = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50, main_grads_dtype=main_grads,
                           cpu_offload_fraction=f)
        m = rank_memory(TINY, ParallelLayout(world_size=2), setup)
        assert m.grads == grad_bytes * 138304
        assert m.optimizer == m.optimizer_sharded == gpu_per_param * share
        assert m.optimizer_host == 16 * f * share
    plain = rank_memory(TINY, ParallelLayout(world_size=2), TrainSetup(dtype="bfloat16", trainable=True, tokens=100,
                                                                      forward_tokens=50))
    assert plain.optimizer_host == 0 and plain.optimizer == 12 * share


def test_pipeline_peak_is_the_first_stage_or_the_last_not_both():
    """1F1B at PP=2: the first stage holds 2 micro-batches of its 1 layer (no logits), the last
    stage 1 micro-batch of its layer plus the logits; the peak is the larger, not their sum."""
    setup = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50)
    m = rank_memory(TINY, ParallelLayout(world_size=2, pp=2), setup)
    first = 2 * 1 * 832 * 100 * 2  # 332800
    last = 1 * 832 * 100 * 2 + 600000  # 166400 + logits
    assert m.activations_train == max(first, last) == 766400


def test_tp_and_sequence_parallel_and_offload_free_setup():
    setup = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=100, sequence_parallel=True,
                       distributed_optimizer=False)
    m = rank_memory(TINY, ParallelLayout(world_size=2, tp=2), setup)
    assert m.params == 138304  # every weight (incl. the vocab-parallel embedding) split over TP=2
    assert m.optimizer == m.optimizer_full == 6 * 138304  # not sharded: DP=1 anyway, and the flag is off
    assert m.activations_train == (332800 + 600000) // 2  # everything /2 with sequence parallelism


def test_reference_has_no_gradients_or_optimizer():
    m = rank_memory(TINY, ParallelLayout(world_size=1), TrainSetup(dtype="bfloat16", trainable=False, tokens=0,
                                                                    forward_tokens=10))
    assert (m.grads, m.optimizer, m.activations_train) == (0, 0, 0)


def test_vllm_kv_cache():
    v = vllm_memory(TINY, tp=1, dtype="bfloat16", gpu_bytes=10_000_000, utilization=0.5)
    assert v.weights == 2 * 138304
    assert v.kv_cache == 5_000_000 - 2 * 138304
    assert v.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # k+v x layers x kv heads x head_dim x bf16


def test_nemotron_h_kv_cache_counts_attention_layers_and_one_sequence_of_mamba_state():
    """Nemotron-H at vLLM TP=2: KV only for its attention layer; per sequence each Mamba layer's convolution
    state (x, B, C channels of this rank x (conv_kernel - 1), bf16) and SSM state (heads x head dim x state, fp32)."""
    shape = ModelShape.from_hf_config(dict(
        model_type="nemotron_h", vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, hybrid_override_pattern="M*MEE-", mamba_num_heads=8, mamba_head_dim=8,
        n_groups=2, ssm_state_size=16, conv_kernel=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, mamba_ssm_cache_dtype="float32"))
    v = vllm_memory(count_params(shape), tp=2, dtype="bfloat16", gpu_bytes=10_000_000, utilization=0.5)
    assert v.kv_bytes_per_token == 1 * 1 * (16 + 16) * 2  # one attention layer, one KV head per rank, k + v
    conv = (64 + 2 * 32) // 2 * 3 * 2
    ssm = 64 // 2 * 16 * 4
    assert v.state_bytes_per_sequence == 2 * (conv + ssm)
    assert v.kv_tokens == (v.kv_cache - v.state_bytes_per_sequence) // v.kv_bytes_per_token


def test_the_update_names_the_pipeline_stage_that_peaks():
    """The stage each figure above is for (a phase's metrics come from the last stage, so the plan says
    which stage its training activations are): the actor's logits make the last stage the larger here, a
    critic's value head (no logits) leaves the first stage's two micro-batches the larger."""
    actor = rank_memory(TINY, ParallelLayout(world_size=2, pp=2),
                        TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50))
    assert (actor.activations_train, actor.train_peak_stage) == (766400, "last")
    critic = rank_memory(TINY, ParallelLayout(world_size=2, pp=2),
                         TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50, value_head=True))
    assert (critic.activations_train, critic.train_peak_stage) == (332800, "first")
    assert rank_memory(TINY, ParallelLayout(world_size=2), TrainSetup(dtype="bfloat16", trainable=True, tokens=100,
                                                                      forward_tokens=50)).train_peak_stage == ""
