"""The Megatron distillation teacher and the actor's distillation loss against HF transformers.

A tiny Qwen2 student and a differently seeded teacher: at TP=2 (vocabulary 97, padded) the teacher
worker's log-prob of each response token and its top-k must equal HF's log_softmax(logits / T) of
the teacher; the actor's `distillation/loss` in an update must equal the formula on HF's student and
teacher distributions (forward_kl_topk: KL over the teacher's top-k; k3 on the sampled token).
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny import (
    RESPONSE_LEN, _hf_response_log_softmax, actor_rollout_ref_config, make_tiny_qwen2, megatron_node, project_config,
    rollout_batch, worker_data,
)

pytestmark = pytest.mark.slow

K, TEMP = 5, 0.9  # the teacher's inference.temperature, unlike the student's rollout temperature 0.7
T = "distillation.teacher_models.teacher_model"


def distillation_section(student: str, teacher: str, tp: int, **loss):
    settings = {"distillation.enabled": True, f"{T}.model_path": teacher, f"{T}.inference.tensor_model_parallel_size": tp,
                f"{T}.inference.dtype": "float32", f"{T}.inference.max_num_seqs": 3, f"{T}.inference.temperature": TEMP,
                **{f"distillation.distillation_loss.{k}": v for k, v in loss.items()}}
    return project_config(student, settings, {}, ()).distillation


def _own_process_attention_env() -> None:
    """Megatron records each model's attention backend in NVTE_* variables; in a run the teacher and
    the actor are separate processes, here they share one."""
    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        os.environ.pop(name, None)


MODES = {"k3": dict(loss_mode="k3"), "forward_kl_topk": dict(loss_mode="forward_kl_topk", topk=K)}


def _body(student: str, teacher: str, batch: dict, tp: int, mode: str) -> dict:
    """The teacher's output for `mode` and the metrics of one actor update on it."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.teacher import TeacherWorker

    common = dict(use_task_rewards=False, use_policy_gradient=False, loss_max_clamp=None, log_prob_min_clamp=None)
    distil = distillation_section(student, teacher, tp, **common, **MODES[mode])
    worker = TeacherWorker(distil, device="cpu")
    _own_process_attention_env()
    worker.init_model()
    scored = worker.compute_teacher_log_prob(worker_data(batch))
    out = {k: scored.batch[k] for k in scored.batch.keys()}
    actor = ActorWorker(actor_rollout_ref_config(student, megatron_node(tensor_model_parallel_size=tp)), "actor",
                        device="cpu", distillation=distil)
    _own_process_attention_env()
    actor.init_model()
    out["metrics"] = actor.update_policy(worker_data({**batch, **out}))
    return out


@pytest.mark.parametrize("mode", ["forward_kl_topk", pytest.param("k3", marks=pytest.mark.extended)])
def test_teacher_and_distillation_loss_equal_hf_at_tp2(tmp_path, mode):
    student = make_tiny_qwen2(str(tmp_path / "student"), seed=0)
    teacher = make_tiny_qwen2(str(tmp_path / "teacher"), seed=1)
    batch = rollout_batch()
    mask = batch["response_mask"].bool()
    results = run_distributed(_body, 2, student, teacher, batch, 2, mode, timeout=400)
    t_all = _hf_response_log_softmax(teacher, batch, TEMP)  # [B, R, V] fp64
    s_all = _hf_response_log_softmax(student, batch, 0.7)  # the actor's rollout temperature (tiny's worker_data)
    t_logp = t_all.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    s_logp = s_all.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    top_logp, top_ids = t_all.topk(K, dim=-1)
    kl = (top_logp.exp() * (top_logp - s_all.gather(-1, top_ids))).sum(-1).clamp_min(0)
    k3 = torch.exp(t_logp - s_logp) - (t_logp - s_logp) - 1
    for out in results:  # every rank returns the full result
        got = out
        if mode == "k3":
            torch.testing.assert_close(got["teacher_logprobs"].double(), t_logp * mask, atol=1e-5, rtol=1e-5)
            assert got["metrics"]["distillation/loss"] == pytest.approx(k3[mask].mean().item(), rel=1e-4)
            continue
        assert got["teacher_logprobs"].shape == (8, RESPONSE_LEN, K)
        torch.testing.assert_close(got["teacher_logprobs"][mask].double(), top_logp[mask], atol=1e-5, rtol=1e-5)
        assert torch.equal(got["teacher_ids"][mask], top_ids[mask])
        assert got["metrics"]["distillation/loss"] == pytest.approx(kl[mask].mean().item(), rel=1e-4)
        assert 0 < got["metrics"]["distillation/teacher_mass"] < 1
