"""End to end on CPU through Ray: the real trainer, Megatron actor/critic, vLLM rollout.

Two steps of GRPO (rollout.mode=sync: one batched generate), and three steps of PPO with a critic
(GAE), in-reward KL and one critic-warmup step (rollout.mode=async, the default: agent loops). The checks use independent references: the dumped responses are
re-scored with the demo scorer, the vLLM-vs-Megatron log-prob gap must be at fp32 noise,
and the warm-up rule is visible in which metrics each step has.
"""

from __future__ import annotations

import math

import pytest

from e2e_utils import demo_config, module_ray, read_metrics, read_rollouts
from megarl.reward.demo_task import compute_score

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def config_reads(tmp_path_factory):
    """Every typed key the runs of this module read, in the driver and in every worker process; the
    runs share one Ray."""
    from megarl.config.schema.field import record_reads_to

    path = tmp_path_factory.mktemp("reads") / "reads"
    record_reads_to(str(path))
    with module_ray():  # started after the recording is on: its workers inherit it
        yield path
    record_reads_to(None)


def _run(cfg):
    from megarl.trainer import run_ppo

    return run_ppo(cfg)


def test_grpo_two_steps(demo_dir, tmp_path):
    cfg = demo_config(demo_dir, tmp_path, ["trainer.total_training_steps=2", "trainer.test_freq=2",
                                           "trainer.save_freq=2", "algorithm.adv_estimator=grpo",
                                           "actor_rollout_ref.rollout.mode=sync"])
    _run(cfg)
    metrics = read_metrics(tmp_path)
    assert sorted(metrics) == [1, 2]
    for step in (1, 2):
        m = metrics[step]
        assert "agent/num_turns/mean" not in m  # sync mode: no agent loop
        assert m["actor/grad_norm"] > 0 and math.isfinite(m["actor/pg_loss"])
        assert m["rollout/log_prob_gap_max"] < 1e-4  # vLLM and Megatron agree on the sampled tokens
        assert m["response_length/mean"] > 0 and m["perf/tokens_per_s"] > 0
        assert "critic/vf_loss" not in m  # GRPO: no critic
        rows = read_rollouts(tmp_path, step)
        assert len(rows) == 4 * 4
        rescored = [compute_score(r["output"], r["ground_truth"]) for r in rows]
        assert [r["score"] for r in rows] == pytest.approx(rescored)
        assert m["critic/score/mean"] == pytest.approx(sum(rescored) / len(rescored), abs=1e-6)
    assert metrics[2]["weight_sync/bytes"] > 0  # the update of step 1 was synced into vLLM
    assert "val/reward/mean" in metrics[2]
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir() and (ckpt / "global_step_2" / "trainer.pt").is_file()


def test_ppo_gae_critic_kl_in_reward_warmup(demo_dir, tmp_path):
    cfg = demo_config(demo_dir, tmp_path, [
        "trainer.total_training_steps=3", "trainer.test_freq=-1",
        "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1",
        "trainer.critic_warmup=1",
    ])
    _run(cfg)
    metrics = read_metrics(tmp_path)
    first, second, third = metrics[1], metrics[2], metrics[3]
    for m in (first, second, third):
        assert m["critic/vf_loss"] >= 0 and m["critic/grad_norm"] > 0
        assert "critic/values/mean" in m and "actor/reward_kl_penalty" in m
    # critic_warmup=1: step 1 trains only the critic, step 2 both.
    assert "actor/pg_loss" not in first and "actor/pg_loss" in second
    # The actor first moves in step 2's update, so KL(actor || ref) is zero in steps 1 and 2
    # (in-reward rewards equal the scores) and non-zero in step 3.
    for m in (first, second):
        assert m["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
        assert m["critic/rewards/mean"] == pytest.approx(m["critic/score/mean"], abs=1e-6)
    assert abs(third["actor/reward_kl_penalty"]) > 1e-6


def test_unimplemented_features_are_config_errors(demo_dir, tmp_path):
    """Validation (run by demo_config, as by main_ppo) refuses it before any trainer exists."""
    from megarl.config import ConfigError

    with pytest.raises(ConfigError, match="multi_turn.function_tool_path"):
        demo_config(demo_dir, tmp_path, ["actor_rollout_ref.rollout.multi_turn.function_tool_path=tools.py"])


def _final_answer_is_right(prompt: str, output: str) -> bool:
    """The demo tool task's reward, derived here: the text after the last tool response is
    ``a op b`` of the prompt ``"a op b ="``, computed in Python."""
    a, op, b = prompt.split("=")[0].split()
    truth = int(a) + int(b) if op == "+" else int(a) - int(b)
    return output.rsplit("</tool_response>", 1)[-1].strip() == str(truth)


def test_grpo_learns_to_call_the_calculator(demo_dir, tmp_path):
    """`+tools=calculator` on the demo runs its tool task (megarl/data/demo_tool_data.py: two-digit
    + and -, which the demo model cannot compute but can copy from the calculator) through the tool
    agent. The warm-up calls the tool in ~25% of sampled answers and answers directly when greedy;
    four GRPO steps raise the greedy validation reward (vs. the run's own step 0) and the call rate."""
    cfg = demo_config(demo_dir, tmp_path / "tool", [
        "+tools=calculator", "trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.val_before_train=true",
    ], small_batches=False)
    _run(cfg)
    m = read_metrics(tmp_path / "tool")
    start, end = m[0]["val/reward/mean"], m[4]["val/reward/mean"]
    assert start < 0.5 and end > start + 0.3, (start, m[2]["val/reward/mean"], end)  # measured 0.19 -> 1.0
    assert m[4]["agent/tool_calls"] > m[1]["agent/tool_calls"] + 0.2  # measured 0.18 -> 0.79 calls a sample
    assert m[4]["agent/malformed_tool_calls"] < 0.1 and m[4]["agent/tool_errors"] < 0.1  # a miscopied expression is rare
    for step in range(1, 5):
        assert m[step]["rollout/log_prob_gap_max"] < 1e-4 and "actor/pg_loss" in m[step]
    rows = read_rollouts(tmp_path / "tool", 4)
    assert len(rows) == 16 * 8
    assert [r["score"] for r in rows] == [float(_final_answer_is_right(r["input"], r["output"])) for r in rows]
    assert any("<tool_call>" in r["output"] and r["score"] == 1.0 for r in rows)


def test_grpo_async_reward_and_dapo_filter_groups(demo_dir, tmp_path):
    """launch_reward_fn_async in rollout.mode=async scores each sample in the rollout worker as its agent
    loop returns (megarl.reward.streaming); then DAPO dynamic sampling keeps only groups whose scores
    differ (a second run dir)."""
    cfg = demo_config(demo_dir, tmp_path / "async", ["trainer.total_training_steps=1", "trainer.test_freq=-1",
                                                     "reward.launch_reward_fn_async=true"])
    _run(cfg)
    m = read_metrics(tmp_path / "async")[1]
    rows = read_rollouts(tmp_path / "async", 1)
    rescored = [compute_score(r["output"], r["ground_truth"]) for r in rows]
    assert [r["score"] for r in rows] == pytest.approx(rescored)
    assert 0.0 <= m["reward/scored_during_rollout"] <= 1.0 and "timing_s/reward_wait" not in m and "actor/pg_loss" in m
    assert m["critic/score/mean"] == pytest.approx(sum(rescored) / len(rescored), abs=1e-6)

    cfg = demo_config(demo_dir, tmp_path / "dapo", [
        "trainer.total_training_steps=1", "trainer.test_freq=-1", "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.max_num_gen_batches=20",
        "reward_model.reward_manager=dapo",  # verl's legacy key: moved to reward.reward_manager.name
        "+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:4,penalty_factor:1.0}",
        "data.max_response_length=8",  # room for the overlong buffer (len 4)
    ])
    _run(cfg)
    m = read_metrics(tmp_path / "dapo")[1]
    rows = read_rollouts(tmp_path / "dapo", 1)
    assert len(rows) == 4 * 4 and m["filter_groups/gen_rounds"] >= 1
    groups = {}
    for r in rows:
        groups.setdefault(r["input"], []).append(r["score"])
    assert all(len(set(scores)) > 1 for scores in groups.values())  # no all-equal group was kept


@pytest.mark.extended  # a third full GRPO run (tests/workers/test_lora.py covers LoRA in the default tier)
def test_grpo_lora_two_steps(demo_dir, tmp_path):
    """LoRA GRPO through the controller: vLLM samples from the synced merged weights (its log-probs
    equal the LoRA actor's), the reference is the base model (KL 0 until the adapters move), and the
    checkpoint holds the adapters only."""
    from torch.distributed.checkpoint import FileSystemReader

    cfg = demo_config(demo_dir, tmp_path, [
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=2", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.alpha=16", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one update per step: step 1 scores the untrained adapters
    ])
    _run(cfg)
    metrics = read_metrics(tmp_path)
    for step in (1, 2):
        assert metrics[step]["rollout/log_prob_gap_max"] < 1e-4  # vLLM has W + alpha/r * B @ A
        assert metrics[step]["actor/grad_norm"] > 0
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # B = 0: actor = base = reference
    assert metrics[2]["actor/kl_loss"] > 1e-7
    assert metrics[2]["weight_sync/bytes"] > 0
    keys = FileSystemReader(str(tmp_path / "ckpt" / "global_step_2" / "actor" / "dist_ckpt")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if not k.startswith(("optimizer", "rng_state"))]
    assert model_keys and all(".lora." in k for k in model_keys)


def _keys(reason: str, *keys: str) -> dict[str, str]:
    return dict.fromkeys(keys, reason)


A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm.rollout_correction"
# Keys these runs do not read through the typed config, each with why and where they are covered.
NOT_EXERCISED_HERE = {
    **_keys("fixed by a Literal type (the one value megarl runs); validated only", f"{A}.strategy",
            "actor_rollout_ref.ref.strategy", "critic.strategy", f"{R}.name",
            "model_engine"),
    **_keys("fixed by a Literal type (the one value megarl's LoRA implements); validated only",
            "actor_rollout_ref.model.lora.type", "actor_rollout_ref.model.lora.lora_B_init_method"),
    **_keys("only with LoRA on (tests/workers/test_lora.py; the extended test_grpo_lora_two_steps here)",
            *(f"actor_rollout_ref.model.lora.{k}" for k in ("alpha", "target_modules", "exclude_modules",
                                                             "lora_A_init_method"))),
    **_keys("read through its interpolation into rollout.weight_sync.bucket_size_mb",
            f"{R}.checkpoint_engine.update_weights_bucket_megabytes"),
    **_keys("verl's legacy keys: moved to reward.* at load (megarl.config.verl_compat.legacy; tests/config/test_rules_algo.py)",
            "custom_reward_function.path", "custom_reward_function.name", "reward_model.reward_manager", "reward_model.enable"),
    **_keys("read by megarl.config (roles, preflight) on the DictConfig", "critic.enable", "actor_rollout_ref.model.tokenizer_path",
            "critic.model.tokenizer_path", "data.tokenizer", "ray_kwargs.ray_init.num_cpus",
            "ray_kwargs.ray_init.runtime_env.py_executable", "ray_kwargs.timeline_json_file",
            "actor_rollout_ref.model.custom_chat_template", "data.trust_remote_code"),
    **_keys("read by the data layer from the DictConfig section, verl's dataset/sampler plugin API (tests/data)",
            *(f"data.{k}" for k in ("apply_chat_template_kwargs", "custom_cls.name", "custom_cls.path", "filter_overlong_prompts",
                                    "max_prompt_length", "max_response_length", "prompt_key", "return_full_prompt",
                                    "return_raw_chat", "reward_fn_key", "sampler.class_name", "sampler.class_path", "seed",
                                    "shuffle", "train_files", "train_max_samples", "truncation", "val_batch_size",
                                    "val_max_samples", "validation_shuffle"))),
    **_keys("read by the reward manager from the DictConfig (custom reward functions get verl's config; tests/reward)",
            "reward.custom_reward_function.name", "reward.custom_reward_function.path",
            "reward.custom_reward_function.reward_kwargs", "reward.reward_kwargs", "reward.reward_manager.name",
            "reward.timeout", "reward.num_workers", "reward.phase_timeout"),
    **_keys("only by the loss mode that uses it (tests/trainer/test_every_loss_mode.py)",
            *(f"{A}.policy_loss.{k}" for k in ("clip_cov_lb", "clip_cov_ratio", "clip_cov_ub", "dro_beta", "kl_cov_ratio",
                                               "ppo_kl_coef")), f"{A}.tau_neg", f"{A}.tau_pos", f"{C}.loss_type"),
    **_keys("only with rollout correction on (tests/algorithms/test_rollout_correction.py)", f"{C}.rollout_is_batch_normalize",
            f"{C}.rollout_is_threshold", f"{C}.rollout_rs_threshold", f"{C}.rollout_rs_threshold_lower"),
    **_keys("validated only: a dense model's vLLM data parallelism is megarl's own replicas, an MoE model's is "
            "refused (megarl.config.rules.rollout_parallel; tests/config/test_rules_rollout_parallel.py)",
            f"{R}.data_parallel_size"),
    **_keys("only by the gdpo estimator (tests/trainer/test_every_loss_mode.py)", "algorithm.gdpo_reward_keys",
            "algorithm.gdpo_reward_weights"),
    **_keys("only by the adaptive KL controller (tests/algorithms/test_kl.py)", "algorithm.kl_ctrl.horizon",
            "algorithm.kl_ctrl.target_kl"),
    **_keys("only with sampled validation, val_kwargs.do_sample=true (tests/rollout/test_rollout_config.py)",
            f"{R}.val_kwargs.temperature", f"{R}.val_kwargs.top_k", f"{R}.val_kwargs.top_p"),
    **_keys("only with reward.reward_model.enable (tests/workers/test_reward_model.py, tests/config/test_reward_model_config.py; "
            "extended: tests/trainer/test_e2e_reward_model.py)", "reward.reward_model.model_path",
            *(f"reward.reward_model.rollout.{k}" for k in ("dtype", "free_cache_engine", "tensor_model_parallel_size",
                                                            "pipeline_model_parallel_size", "max_model_len", "max_num_seqs",
                                                            "prompt_length", "response_length"))),
    **_keys("only with distillation.enabled (tests/workers/test_teacher.py, tests/algorithms/test_distillation_losses.py, "
            "tests/config/test_distillation_config.py; extended: tests/trainer/test_e2e_distillation.py)",
            "distillation.nnodes", "distillation.n_gpus_per_node", "distillation.teacher_models.teacher_model.model_path",
            *(f"distillation.distillation_loss.{k}" for k in (
                "loss_mode", "topk", "use_task_rewards", "distillation_loss_coef", "loss_max_clamp", "log_prob_min_clamp",
                "use_policy_gradient", "policy_loss_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high")),
            *(f"distillation.teacher_models.teacher_model.inference.{k}" for k in (
                "dtype", "free_cache_engine", "tensor_model_parallel_size", "max_model_len", "max_num_seqs",
                "prompt_length", "response_length", "temperature"))),
    **_keys("only with megatron's distributed optimizer, which runs on CUDA only (tests/workers/test_checkpoint_format.py; "
            "tests/gpu/test_gpu_e2e.py saves and resumes with both formats)",
            *(f"{role}.megatron.{k}" for role in (A, "critic") for k in ("dist_ckpt_optim_fully_reshardable",
                                                                         "distrib_optim_fully_reshardable_mem_efficient"))),
    **_keys("only with trainer.v1's async modes (tests/trainer/test_e2e_async.py, tests/trainer/test_v1_sampler.py)",
            "trainer.v1.colocate_async.num_warmup_batches", "trainer.v1.separate_async.num_warmup_batches",
            "trainer.v1.sampler.max_off_policy_threshold", "trainer.v1.sampler.max_off_policy_strategy",
            f"{R}.nnodes", f"{R}.n_gpus_per_node"),
    **_keys("read by the config rules only: verl's invariant data.train_batch_size = parameter_sync_step x "
            "ppo_mini_batch_size; false exactly with separate_async (tests/config/test_rules_v1.py)",
            "trainer.v1.separate_async.parameter_sync_step", "actor_rollout_ref.hybrid_engine"),
    **_keys("only on resume or with use_dist_checkpointing (tests/fault/test_kill_resume.py, tests/workers)",
            f"{A}.checkpoint.load_contents", "critic.checkpoint.load_contents", "critic.checkpoint.save_contents",
            f"{A}.megatron.dist_checkpointing_path", "actor_rollout_ref.ref.megatron.dist_checkpointing_path",
            "critic.megatron.dist_checkpointing_path"),
}


def test_the_runs_read_every_typed_key(config_reads):
    """A key megarl types must be read by the code (here: by the GRPO, PPO and DAPO runs above);
    a key no run reads is dead (e.g. a documented sampling seed that never reaches the engine)."""
    from megarl.config.schema.root import MegaRLConfig
    from megarl.config.schema.field import iter_schema_keys

    files = list(config_reads.parent.glob(config_reads.name + ".*"))
    if not files:
        pytest.skip("no run of this module ran (select the whole module)")
    read = set().union(*(f.read_text().split() for f in files))
    typed = {key for key, _, _ in iter_schema_keys(MegaRLConfig)}
    unread = sorted(typed - read - set(NOT_EXERCISED_HERE))
    assert not unread, f"typed keys no run read (implement them, or move them to verl_compat/accepted_keys.py): {unread}"
