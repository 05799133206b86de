"""Megatron-FSDP (`megatron.use_megatron_fsdp`) in the memory plan: parameters and gradients sharded
over DP, plus the layers gathered in a pass and the whole TP-local model in the weight sync; numbers
derived by hand for Qwen2.5-7B's shape at DP=4, TP=1."""

from __future__ import annotations

import json

from megarl.config import resolve_config
from megarl.config.compose import load_config
from megarl.parallel.layout import ParallelLayout
from megarl.plan.build import build_plan
from megarl.plan.memory import TrainSetup, rank_memory
from megarl.plan.model_size import ModelShape, count_params

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
# one layer: q 3584x3584 + 3584 bias, k and v 3584x512 + 512 bias each, o 3584x3584, 2 norms of 3584;
# MLP gate, up, down 3 x 3584 x 18944
LAYER = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 2 * 3584 + 3 * 3584 * 18944  # 233,057,792
TOTAL = 28 * LAYER + 2 * 152064 * 3584 + 3584  # untied embedding and LM head, final norm: 7,615,616,512
FSDP_KEY = "actor_rollout_ref.actor.megatron.use_megatron_fsdp"


def test_7b_at_dp4_holds_a_quarter_of_params_and_grads_plus_two_layers():
    p = count_params(ModelShape.from_hf_config(QWEN25_7B))
    assert p.total == TOTAL
    layout = ParallelLayout(world_size=4)  # TP=1, DP=4
    ddp = rank_memory(p, layout, TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=100))
    fsdp = rank_memory(p, layout, TrainSetup(dtype="bfloat16", trainable=True, tokens=100, forward_tokens=100,
                                             megatron_fsdp=True))
    assert (ddp.params, ddp.grads, ddp.fsdp) == (2 * TOTAL, 4 * TOTAL, None)  # bf16 params, fp32 grads, whole
    assert fsdp.params == 2 * TOTAL // 4 and fsdp.grads == 4 * TOTAL // 4
    assert fsdp.optimizer == ddp.optimizer == 12 * TOTAL // 4  # the distributed optimizer's share either way
    assert fsdp.fsdp.layers == 2 * LAYER * 2 and fsdp.fsdp.layer_grads == 2 * LAYER * 4
    assert fsdp.fsdp.model == 2 * TOTAL
    # params + grads + transient: about a quarter of DDP's 45.7 GB plus 2.8 GB
    assert fsdp.params + fsdp.grads + fsdp.fsdp.layers + fsdp.fsdp.layer_grads == 6 * TOTAL // 4 + 12 * LAYER


def test_a_forward_only_model_gathers_no_gradients():
    p = count_params(ModelShape.from_hf_config(QWEN25_7B))
    ref = rank_memory(p, ParallelLayout(world_size=4), TrainSetup(dtype="bfloat16", trainable=False, tokens=0,
                                                                  forward_tokens=100, megatron_fsdp=True))
    assert ref.params == 2 * TOTAL // 4 and ref.grads == 0 and ref.fsdp.layer_grads == 0


def _plan(tmp_path, *overrides):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    cfg = resolve_config(load_config([
        f"actor_rollout_ref.model.path={tmp_path}", "trainer.nnodes=1", "trainer.n_gpus_per_node=4",
        "data.max_prompt_length=1024", "data.max_response_length=1024",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true", "trainer.save_freq=-1", *overrides]))
    return build_plan(cfg, 80.0, None)


def test_the_plan_reads_the_fsdp_key(tmp_path):
    """The same run with the key on: the actor's update needs 3/4 of its parameters and gradients less,
    plus two gathered layers and their gradients; its sync gathers the whole model."""
    ddp, fsdp = _plan(tmp_path), _plan(tmp_path, f"{FSDP_KEY}=true")
    update_ddp, update_fsdp = ddp.phases["update_actor"].terms, fsdp.phases["update_actor"].terms
    assert update_ddp["actor params"] - update_fsdp["actor params"] == 2 * TOTAL - 2 * TOTAL // 4
    assert update_ddp["actor grads"] - update_fsdp["actor grads"] == 4 * TOTAL - 4 * TOTAL // 4
    assert update_fsdp["actor FSDP gathered layers"] == 4 * LAYER
    assert update_fsdp["actor FSDP gathered layer grads"] == 8 * LAYER
    assert not any("FSDP" in term for phase in ddp.phases.values() for term in phase.terms)
    assert fsdp.phases["old_log_prob"].terms["actor FSDP gathered layers"] == 4 * LAYER
    assert "actor FSDP gathered layer grads" not in fsdp.phases["old_log_prob"].terms
    assert fsdp.phases["sync"].terms["actor FSDP gathered model"] == 2 * TOTAL
    assert fsdp.phases["sync"].terms["actor params"] == 2 * TOTAL // 4


def test_the_reference_key_has_no_effect(tmp_path):
    """verl wraps only trained models in Megatron-FSDP: the reference stays whole."""
    ref_fsdp = "actor_rollout_ref.ref.megatron.use_megatron_fsdp=true"
    plan = _plan(tmp_path, "actor_rollout_ref.actor.use_kl_loss=true", ref_fsdp,
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1")
    assert plan.phases["ref_log_prob"].terms["ref params"] == 2 * TOTAL
    assert not any("FSDP" in term for term in plan.phases["ref_log_prob"].terms)
