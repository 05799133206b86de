"""Rules of on-policy distillation (`distillation.*`, megarl.workers.teacher and
megarl.algorithms.distillation): verl's own checks (k1 needs use_policy_gradient, top-k needs topk,
the teacher's context must hold the student's prompt and response), plus the teacher model's files,
vocabulary and layout."""

from __future__ import annotations

from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.model import kv_heads_split, model_dir, read_hf_config
from megarl.config.rules.roles import ACTOR, TEACHER_ROLE
from megarl.config.rules.view import View

D = "distillation"
LOSS = f"{D}.distillation_loss"
INFER = f"{D}.teacher_models.teacher_model.inference"


def distillation_loss(v: View) -> Iterator[Issue]:
    if not v.get(f"{D}.enabled"):
        return
    mode = v.get(f"{LOSS}.loss_mode")
    if mode == "k1" and not v.get(f"{LOSS}.use_policy_gradient"):
        yield Issue(f"{LOSS}.loss_mode", mode,
                    "backpropagating the k1 loss is incorrect: its gradient does not depend on the teacher (verl refuses it too)",
                    f"set {LOSS}.use_policy_gradient=true (k1 as a reward), or loss_mode=k3 / forward_kl_topk")
    if mode == "forward_kl_topk":
        if v.get(f"{LOSS}.topk") is None:
            yield Issue(f"{LOSS}.topk", None, "forward_kl_topk needs the number of teacher log-probs per token",
                        f"set {LOSS}.topk (verl's default 32)")
        cp = v.get(f"{ACTOR.megatron}.context_parallel_size")
        if cp > 1:
            yield Issue(f"{ACTOR.megatron}.context_parallel_size", cp,
                        "forward_kl_topk is not implemented under context parallelism in megarl",
                        f"set it to 1, or use an estimator {LOSS}.loss_mode (k3, ...)")


def teacher(v: View) -> Iterator[Issue]:
    if not v.get(f"{D}.enabled"):
        return
    prompt, response, max_len = (v.get(f"{INFER}.{k}") for k in ("prompt_length", "response_length", "max_model_len"))
    if max_len is not None and prompt + response + 1 > max_len:
        yield Issue(f"{INFER}.max_model_len", max_len,
                    f"the teacher reads the student's prompt and response: prompt_length {prompt} + response_length "
                    f"{response} + 1 > {max_len} (verl's check)", f"set it to at least {prompt + response + 1} or null")
    tp, nnodes = v.get(f"{INFER}.tensor_model_parallel_size"), v.get(f"{D}.nnodes")
    if nnodes > 0:
        world, where = nnodes * v.get(f"{D}.n_gpus_per_node"), f"the teacher pool {D}.nnodes x {D}.n_gpus_per_node"
    else:
        world, where = v.world_size(), "the trainer world trainer.nnodes x n_gpus_per_node (distillation.nnodes=0: colocated)"
    if world % tp:
        yield Issue(f"{INFER}.tensor_model_parallel_size", tp, f"does not divide {where} = {world}",
                    f"choose a TP size dividing {world}")
    hf = yield from model_dir(v, TEACHER_ROLE)
    if hf is None:
        return
    student, _ = read_hf_config(v, ACTOR.model_path, ACTOR.override_config)
    if student is not None and student.get("vocab_size") != hf.get("vocab_size"):
        yield Issue(TEACHER_ROLE.model_path, v.get(TEACHER_ROLE.model_path),
                    f"the teacher's vocab_size {hf.get('vocab_size')} differs from the student's {student.get('vocab_size')}: "
                    "its log-probs must be over the student's tokens", "distil from a teacher with the student's tokenizer")
    heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads") or hf.get("num_attention_heads")
    if isinstance(heads, int) and isinstance(kv, int) and (heads % tp or not kv_heads_split(kv, tp)):
        yield Issue(f"{INFER}.tensor_model_parallel_size", tp,
                    f"does not divide the teacher's num_attention_heads={heads}, or neither divides its "
                    f"num_key_value_heads={kv} nor is a multiple of it", f"choose a TP size dividing {heads} and {kv}, "
                    f"or dividing {heads} and a multiple of {kv}")


RULES = (distillation_loss, teacher)
