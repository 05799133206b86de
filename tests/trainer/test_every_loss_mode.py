"""Issue 9: every registered policy loss, advantage estimator and loss_agg_mode is accepted
by config validation and runs.

* validation: each registered name passes ``collect_issues``; an unknown one is rejected
  with a message listing every valid name;
* one real Megatron ActorWorker (CPU, gloo, tiny Qwen2) takes one PPO step per loss mode:
  the worker's ``actor/pg_loss`` equals the registry function evaluated on the worker's own
  log-probs (one micro-batch), the loss and grad norm are finite and the weights move;
* one controller (Ray, vLLM rollout, Megatron actor + critic, loss_mode=gspo with
  seq-mean-token-mean) takes one step per estimator, switching
  ``algorithm.adv_estimator`` between steps; rloo and grpo advantages are checked against
  the dumped scores, remax advantages against score - greedy-baseline score (the trainer's
  extra greedy generation per prompt), optimal_token_baseline runs on the actor's
  sum_pi_squared (``actor.calculate_sum_pi_squared``).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers.cpu_config import CPU_SMALL
from helpers.dist_utils import run_distributed
from e2e_utils import demo_config
from loss_mode_bodies import CLIP_GRAD, LR, one_step_per_loss_mode
from megarl.algorithms import ADV_ESTIMATORS, POLICY_LOSSES
from megarl.config.names import LOSS_AGG_MODES
from megarl.config import collect_issues, load_config

ACTOR = "actor_rollout_ref.actor"
# Keys a name needs besides itself to form a valid config.
LOSS_NEEDS = {"dro": {f"{ACTOR}.policy_loss.dro_beta": 0.1},
              "bypass_mode": {"algorithm.rollout_correction.bypass_mode": True}}
ESTIMATOR_NEEDS = {"gdpo": {"algorithm.gdpo_reward_keys": ["reward_extra/score"]},
                   "optimal_token_baseline": {f"{ACTOR}.calculate_sum_pi_squared": True}}

# Worker cases: name -> (loss_mode, actor.policy_loss values, algorithm.rollout_correction values
# the actor worker gets). Ratios large enough that clip_cov / kl_cov select tokens in a 40-token batch.
RC = {"bypass_mode": True, "rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": None}
WORKER_CASES = {
    "vanilla": ("vanilla", {}, {}),
    "clip_cov": ("clip_cov", {"clip_cov_ratio": 0.2, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}, {}),
    "kl_cov": ("kl_cov", {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.1}, {}),
    "gpg": ("gpg", {}, {}),
    "gspo": ("gspo", {}, {}),
    "sapo": ("sapo", {}, {}),
    "cispo": ("cispo", {}, {}),
    "geo_mean": ("geo_mean", {}, {}),
    "dppo_tv": ("dppo_tv", {}, {}),
    "dppo_kl": ("dppo_kl", {}, {}),
    "dro": ("dro", {"dro_beta": 0.1}, {}),
    "bypass_mode-ppo_clip": ("bypass_mode", {}, {**RC, "loss_type": "ppo_clip"}),
    "bypass_mode-reinforce": ("bypass_mode", {}, {**RC, "loss_type": "reinforce"}),
}

@pytest.fixture(scope="module")
def base_cfg(demo_dir):
    # a real run's config for this CPU machine (the demo profile applies only without a model path)
    return load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={demo_dir}/model",
                        f"data.train_files={demo_dir}/train.parquet", f"data.val_files={demo_dir}/val.parquet"])


def issues(base_cfg, settings: dict) -> list:
    cfg = copy.deepcopy(base_cfg)
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    return collect_issues(cfg)


# ---------------------------------------------------------------- validation (fast)
def test_registries_hold_the_documented_names():
    assert {"vanilla", "clip_cov", "kl_cov", "gpg", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl",
            "dro", "bypass_mode"} <= set(POLICY_LOSSES)
    assert {"gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "opo", "gpg"} <= set(ADV_ESTIMATORS)
    assert set(LOSS_AGG_MODES) == {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                   "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("key, names, needs", [
    (f"{ACTOR}.policy_loss.loss_mode", sorted(POLICY_LOSSES), LOSS_NEEDS),
    ("algorithm.adv_estimator", sorted(ADV_ESTIMATORS), ESTIMATOR_NEEDS),
    (f"{ACTOR}.loss_agg_mode", sorted(LOSS_AGG_MODES), {}),
])
def test_validation_accepts_every_registered_name(base_cfg, key, names, needs):
    for name in names:
        found = issues(base_cfg, {key: name, **needs.get(name, {})})
        assert not found, f"{key}={name}:\n" + "\n".join(i.format() for i in found)


@pytest.mark.parametrize("key, names", [
    (f"{ACTOR}.policy_loss.loss_mode", POLICY_LOSSES),
    ("algorithm.adv_estimator", ADV_ESTIMATORS),
    (f"{ACTOR}.loss_agg_mode", LOSS_AGG_MODES),
])
def test_validation_rejects_an_unknown_name_listing_the_valid_ones(base_cfg, key, names):
    found = [i for i in issues(base_cfg, {key: "no_such_name"}) if i.key == key]
    assert found, f"no issue for {key}=no_such_name"
    text = found[0].format()
    assert "no_such_name" in text
    assert all(name in text for name in names), text


# ---------------------------------------------------------------- one worker, every loss mode
def test_cases_cover_every_registered_loss_mode():
    assert {mode for mode, _, _ in WORKER_CASES.values()} == set(POLICY_LOSSES)


@pytest.mark.slow
def test_actor_worker_steps_with_every_loss_mode(tmp_path):
    from helpers.tiny import make_tiny_qwen2, rollout_batch

    model = make_tiny_qwen2(str(tmp_path / "model"))
    (results,) = run_distributed(one_step_per_loss_mode, 1, model, rollout_batch(8), WORKER_CASES, timeout=300)
    assert set(results) == set(WORKER_CASES)
    for name, r in results.items():
        m = r["metrics"]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), (name, m)
        assert m["actor/pg_loss"] == pytest.approx(r["reference_pg_loss"], rel=1e-4, abs=1e-6), name
        # SGD from an empty state: |step| = lr * min(|grad|, clip_grad) (see loss_mode_bodies).
        assert m["actor/grad_norm"] > 0, (name, m)
        assert r["param_change_norm"] == pytest.approx(LR * min(m["actor/grad_norm"], CLIP_GRAD), rel=1e-3), name
    assert any(k.startswith("rollout_corr/") for k in results["bypass_mode-reinforce"]["metrics"])


# ---------------------------------------------------------------- one controller, every estimator
@pytest.fixture(scope="module")
def controller(demo_dir, tmp_path_factory):
    import ray

    from megarl.trainer.ppo_trainer import RayPPOTrainer

    run_dir = tmp_path_factory.mktemp("run")
    cfg = demo_config(demo_dir, run_dir, [
        "trainer.total_training_steps=100", "trainer.test_freq=-1", "critic.enable=true",
        f"{ACTOR}.policy_loss.loss_mode=gspo", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean",
        f"{ACTOR}.calculate_sum_pi_squared=true",  # worker config: fixed for every estimator
    ])
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    trainer = RayPPOTrainer(cfg)
    try:
        trainer.init_workers()
        yield trainer, run_dir
    finally:
        trainer.close()
        if started:
            ray.shutdown()


def _rows(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]


def _groups(run_dir: Path, step: int) -> list[list[float]]:
    groups: dict[str, list[float]] = {}
    for row in _rows(run_dir, step):
        groups.setdefault(row["input"], []).append(float(row["score"]))
    return list(groups.values())


def _greedy_scores(trainer, prompts) -> dict[str, float]:
    """Independent of the trainer's remax path: greedy responses to ``prompts`` under the
    weights the step will sample with (the call syncs them), scored, by prompt text."""
    from megarl.protocol import DataProto

    greedy = DataProto(batch=prompts.batch.clone(), non_tensor_batch=dict(prompts.non_tensor_batch),
                       meta_info=dict(prompts.meta_info))
    out = trainer.actor.call_rollout("generate_sequences", greedy, validate=False, do_sample=False)
    out.meta_info.pop("metrics", None)
    assert len(out) == len(prompts)
    scores = trainer.rollout.reward_fn(out)[0].sum(-1).tolist()
    return dict(zip(trainer._texts(out)[0], scores))


def _reference_advantages(estimator: str, groups: list[list[float]]) -> torch.Tensor:
    """Outcome advantages from the scores alone (verl's formulas)."""
    out = []
    responses = sum(len(scores) for scores in groups)
    nonzero = sum(1 for scores in groups for score in scores if score != 0)
    for scores in groups:
        s = torch.tensor(scores, dtype=torch.float64)
        n = len(s)
        if estimator == "rloo":
            out.append((s - s.mean()) * n / (n - 1))
        elif estimator == "gpg":  # alpha = batch / #non-zero scores, f_norm = 1
            out.append((s - s.mean()) * responses / max(1, nonzero))
        else:  # grpo, norm_adv_by_std_in_grpo=true
            out.append((s - s.mean()) / (s.std() + 1e-6))
    return torch.cat(out)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATORS))
def test_controller_step_with_every_estimator(controller, estimator):
    trainer, run_dir = controller
    trainer.cfg.algorithm.adv_estimator = estimator  # the trainer's typed config
    trainer.cfg.algorithm.gdpo_reward_keys = ESTIMATOR_NEEDS.get(estimator, {}).get("algorithm.gdpo_reward_keys")
    prompts_iter = iter(trainer.train_loader)
    prompts = next(prompts_iter)
    greedy_scores = _greedy_scores(trainer, prompts) if estimator == "remax" else None
    trainer.global_step += 1
    m = trainer.train_step(prompts, prompts_iter)
    assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), m
    assert math.isfinite(m["critic/vf_loss"]) and m["critic/grad_norm"] > 0, m
    for stat in ("mean", "max", "min"):
        assert math.isfinite(m[f"critic/advantages/{stat}"]), m
    if estimator in ("rloo", "grpo", "gpg"):
        reference = _reference_advantages(estimator, _groups(run_dir, trainer.global_step))
        assert m["critic/advantages/max"] == pytest.approx(reference.max().item(), abs=1e-4)
        assert m["critic/advantages/min"] == pytest.approx(reference.min().item(), abs=1e-4)
        # a step whose every group scored alike has no advantage, hence (no entropy or KL loss) no gradient
        assert (m["actor/grad_norm"] > 0) == bool(reference.abs().max() > 0), (reference, m)
    else:
        assert m["actor/grad_norm"] > 0, m
    if estimator == "remax":
        assert m["timing_s/gen_max"] > 0, m
        rows = _rows(run_dir, trainer.global_step)
        greedy: dict[str, set[float]] = {}
        for row in rows:  # one greedy response per prompt: one baseline for all its samples
            greedy.setdefault(row["input"], set()).add(row["reward_baseline"])
        assert all(len(v) == 1 for v in greedy.values()), greedy
        assert {k: v.pop() for k, v in greedy.items()} == pytest.approx(greedy_scores)
        # outcome reward on the last token: every valid token's advantage is score - baseline
        reference = torch.tensor([row["score"] - row["reward_baseline"] for row in rows])
        assert m["critic/advantages/max"] == pytest.approx(reference.max().item(), abs=1e-5)
        assert m["critic/advantages/min"] == pytest.approx(reference.min().item(), abs=1e-5)
