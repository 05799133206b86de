"""Batch-size rules (units: prompts for train/mini batch, responses per rank for micro)."""

from __future__ import annotations

from config_testing import issue_for, no_issues

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def test_mini_batch_must_divide_train_batch(make):
    issue = issue_for(make({"data.train_batch_size": 12, f"{A}.ppo_mini_batch_size": 8}), f"{A}.ppo_mini_batch_size", "data.train_batch_size=12")
    assert "=6" in issue.fix  # largest divisor of 12 that is <= 8


def test_mini_batch_responses_must_split_over_dp(make):
    # world 4, tp 1 -> dp 4; 1 prompt x n 2 = 2 responses cannot split over 4 ranks.
    cfg = make({"trainer.n_gpus_per_node": 4, f"{A}.ppo_mini_batch_size": 1, f"{R}.n": 2, f"{A}.ppo_micro_batch_size_per_gpu": 1})
    issue_for(cfg, f"{A}.ppo_mini_batch_size", "4 data-parallel ranks")


def test_dp_counts_model_parallel_ranks(make):
    # world 4 with tp 2 -> dp 2: 1 prompt x n 2 = 2 responses split fine (1 per rank).
    cfg = make({"trainer.n_gpus_per_node": 4, f"{A}.megatron.tensor_model_parallel_size": 2, f"{A}.ppo_mini_batch_size": 1,
                f"{R}.n": 2, f"{A}.ppo_micro_batch_size_per_gpu": 1})
    no_issues(cfg)


def test_micro_batch_larger_than_mini_batch(make):
    # 8 prompts x n 8 / dp 1 = 64 responses per rank
    issue_for(make({f"{A}.ppo_micro_batch_size_per_gpu": 128}), f"{A}.ppo_micro_batch_size_per_gpu", "64 responses")


def test_micro_batch_must_divide_per_rank_mini_batch(make):
    issue_for(make({f"{A}.ppo_micro_batch_size_per_gpu": 24}), f"{A}.ppo_micro_batch_size_per_gpu", "must divide")


def test_micro_batch_required_without_dynamic_bsz(make):
    issue_for(make({f"{A}.ppo_micro_batch_size_per_gpu": None}), f"{A}.ppo_micro_batch_size_per_gpu", "required")


def test_micro_batch_not_needed_with_dynamic_bsz(make):
    no_issues(make({f"{A}.ppo_micro_batch_size_per_gpu": None, f"{A}.use_dynamic_bsz": True}))


def test_dynamic_bsz_token_budget_must_hold_one_sequence(make):
    # max_prompt_length 32 + max_response_length 8 = 40 tokens
    cfg = make({f"{A}.use_dynamic_bsz": True, f"{A}.ppo_max_token_len_per_gpu": 39})
    issue_for(cfg, f"{A}.ppo_max_token_len_per_gpu", "40")
    # The rollout/ref log-prob budgets interpolate the actor's: reported under their own keys too.
    issue_for(cfg, f"{R}.log_prob_max_token_len_per_gpu", "40")


def test_token_budget_counts_context_parallel_ranks(make):
    """verl: a micro-batch holds max_token_len x cp tokens (each CP rank computes 1/cp of them)."""
    cp2 = {"trainer.n_gpus_per_node": 2, f"{A}.megatron.context_parallel_size": 2, f"{A}.use_dynamic_bsz": True}
    no_issues(make({**cp2, f"{A}.ppo_max_token_len_per_gpu": 20}))
    issue_for(make({**cp2, f"{A}.ppo_max_token_len_per_gpu": 19}), f"{A}.ppo_max_token_len_per_gpu",
              "context_parallel_size=2", ">= 20")


def test_old_log_prob_micro_batch_required(make):
    issue_for(make({f"{R}.log_prob_micro_batch_size_per_gpu": None}), f"{R}.log_prob_micro_batch_size_per_gpu", "required")


def test_ref_micro_batch_required_only_when_ref_runs(make):
    no_issues(make({"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None}))
    cfg = make({"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None, f"{A}.use_kl_loss": True})
    issue_for(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "required")


def test_critic_batches_checked_when_critic_runs(make):
    cfg = make({"critic.ppo_micro_batch_size_per_gpu": 128})
    no_issues(cfg)  # grpo: no critic
    cfg = make({"critic.ppo_micro_batch_size_per_gpu": 128, "algorithm.adv_estimator": "gae"})
    issue_for(cfg, "critic.ppo_micro_batch_size_per_gpu", "64 responses")


def test_critic_forward_micro_batches(make):
    gae = {"algorithm.adv_estimator": "gae"}
    issue_for(make({**gae, "critic.use_dynamic_bsz": True, "critic.forward_max_token_len_per_gpu": 8}),
              "critic.forward_max_token_len_per_gpu", "smaller than one full sequence")
