"""The plan's MoE activation term: a hand-computed example, and what megatron-core really saves for backward
in an MoE layer (measured with autograd's saved-tensor hooks on CPU): per expert token copy the permuted hidden
state that feeds the expert GEMMs besides the expert's own intermediates, the copies the plan once left out."""

from __future__ import annotations

import pytest

from helpers.dist_utils import run_distributed
from helpers.tiny_hf import build_tiny_qwen3_moe
from megarl.parallel.layout import ParallelLayout
from megarl.plan.memory import TrainSetup, rank_memory
from megarl.plan.model_size import ModelShape, count_params

MOE = count_params(ModelShape.from_hf_config(dict(
    model_type="qwen3_moe", vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, tie_word_embeddings=True)))


def test_hand_computed_moe_activations():
    setup = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50)
    m = rank_memory(MOE, ParallelLayout(world_size=2, ep=2), setup)
    # per token per layer: attention 2*64 (norm in/out) + 4*16 + 2*16 (q, k) + 2*16 + 4*16 (v, attn out) = 320;
    # MoE 2*64 (norm in/out) + 2 copies x (64 permuted hidden + 3*32 gate/up + SwiGLU) = 448 -> 768 x 2 layers;
    # dispatcher: 2 buffers x 2 copies x 64 = 256; logits 100 x 1000 x 6 bytes
    assert m.activations_train == (768 * 2 + 256) * 100 * 2 + 600000
    # forward only: one layer + the dispatcher (1024 x 50 x 2) + logits 50 x 1000 x 6
    assert m.activations_forward == 1024 * 50 * 2 + 300000
    # expert TP 1 under TP = 2 with sequence parallelism: each rank's experts see its half of the tokens
    sp = TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=50, sequence_parallel=True)
    half = rank_memory(MOE, ParallelLayout(world_size=2, tp=2, etp=1), sp)
    assert half.activations_train == ((320 + 448) * 2 + 256) * 100 * 2 // 2 + 600000 // 2


def _saved_in_moe_block(hf_dir: str, tokens: int) -> list[int]:
    """Sizes (elements) of the tensors megatron saves for backward in an MoE layer's MLP block, on CPU."""
    import torch
    import transformers

    from megarl.models import build_model
    from megarl.parallel import init_distributed

    class Node(dict):
        __getattr__ = dict.__getitem__

    layout = Node(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=1,
                  context_parallel_size=1, virtual_pipeline_model_parallel_size=None, expert_tensor_parallel_size=None,
                  sequence_parallel=False, override_transformer_config={})
    init_distributed(layout, "cpu", seed=1)
    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    model = build_model(hf, layout, device="cpu", dtype=torch.float32)[0].train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inside = [False]
    moe = model.decoder.layers[1].mlp  # layer 0 is dense
    moe.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True))
    moe.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))
    saved: dict[int, int] = {}

    def pack(t):
        if inside[0] and t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(0, 90, (1, tokens)), torch.arange(tokens)[None], None)
    return sorted(saved.values())


@pytest.mark.slow
def test_moe_layer_saves_the_permuted_hidden_states_for_backward(tmp_path):
    """What the plan counts per expert token copy besides the expert's gate/up and SwiGLU outputs: the permuted
    hidden state the expert GEMMs read, ``[tokens x top-k, hidden]``, kept for their weight gradients."""
    hf_dir = build_tiny_qwen3_moe(tmp_path, num_layers=2, num_experts=8, mlp_only_layers=(0,))
    tokens, hidden, k = 512, 128, 2
    sizes = run_distributed(_saved_in_moe_block, 1, str(hf_dir), tokens)[0]
    assert tokens * k * hidden in sizes
    assert max(sizes) == tokens * k * hidden  # the largest saved tensor of the block
