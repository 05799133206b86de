"""End to end on CPU through Ray: on-policy distillation of the demo policy towards a differently
seeded demo model (the teacher, a forward-only Megatron worker colocated with the actor), verl's
forward_kl_topk with the task reward off, as verl's Megatron example runs it. The teacher KL the run
reports must fall over the steps: the loss reaches the student's weights."""

from __future__ import annotations

import pytest

from e2e_utils import demo_config, read_metrics

# Ray + vLLM start-up and several steps: extended tier (the losses are checked against formulas and
# the dense KL in the default tier, tests/algorithms/test_distillation_losses.py)
pytestmark = [pytest.mark.slow, pytest.mark.extended]

STEPS = 5


def make_teacher(out_dir: str) -> str:
    from megarl.data.demo_model import MODEL_SEED, build_demo_model
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    tok = build_demo_tokenizer()
    build_demo_model(tok, seed=MODEL_SEED + 1).save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.mark.parametrize("loss_mode, teacher_nodes", [("forward_kl_topk", 0), ("k3", 0), ("forward_kl_topk", 1)],
                         ids=["forward_kl_topk-colocated", "k3-colocated", "forward_kl_topk-own-pool"])
def test_teacher_kl_falls(demo_dir, tmp_path_factory, tmp_path, loss_mode, teacher_nodes):
    """teacher_nodes: distillation.nnodes (0: on the trainer's slots; 1: its own Ray pool of one slot)."""
    teacher = make_teacher(str(tmp_path_factory.mktemp("teacher")))
    T = "distillation.teacher_models.teacher_model"
    cfg = demo_config(demo_dir, tmp_path, [
        f"trainer.total_training_steps={STEPS}", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.optim.lr=1e-2",
        "distillation.enabled=true", f"{T}.model_path={teacher}", f"{T}.inference.tensor_model_parallel_size=1",
        f"{T}.inference.dtype=float32", f"{T}.inference.max_num_seqs=4",
        f"distillation.distillation_loss.loss_mode={loss_mode}", "distillation.distillation_loss.topk=8",
        "distillation.distillation_loss.use_task_rewards=false",
        f"distillation.nnodes={teacher_nodes}", "distillation.n_gpus_per_node=1",
    ])
    from megarl.trainer import run_ppo

    run_ppo(cfg)
    metrics = read_metrics(tmp_path)
    losses = [metrics[s]["distillation/loss"] for s in range(1, STEPS + 1)]
    assert metrics[1]["timing_s/teacher"] > 0
    if loss_mode == "forward_kl_topk":
        assert 0 < metrics[1]["distillation/teacher_mass"] <= 1 and 0 < metrics[1]["distillation/student_mass"] <= 1
    print("distillation/loss per step:", losses)
    assert losses[-1] < 0.8 * losses[0], losses
