"""Algorithm / rollout / reward cross-key rules."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues
from megarl.config.names import GROUP_ADV_ESTIMATORS

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


@pytest.mark.parametrize("estimator", GROUP_ADV_ESTIMATORS)
def test_group_estimators_need_n_at_least_2(make, estimator):
    overrides = {"algorithm.adv_estimator": estimator, f"{R}.n": 1, f"{A}.ppo_micro_batch_size_per_gpu": 8}
    if estimator == "gdpo":
        overrides["algorithm.gdpo_reward_keys"] = ["acc"]
    issue_for(make(overrides), f"{R}.n", estimator, ">= 2")


@pytest.mark.parametrize("estimator", ["gae", "remax", "reinforce_plus_plus"])
def test_non_group_estimators_accept_n_1(make, estimator):
    no_issues(make({"algorithm.adv_estimator": estimator, f"{R}.n": 1, f"{A}.ppo_micro_batch_size_per_gpu": 8, "critic.ppo_micro_batch_size_per_gpu": 8}))


def test_group_estimator_with_greedy_rollout(make):
    issue_for(make({f"{R}.do_sample": False}), f"{R}.do_sample", "identical")


def test_kl_in_reward_and_kl_loss_together(make):
    issue_for(make({"algorithm.use_kl_in_reward": True, f"{A}.use_kl_loss": True}), "algorithm.use_kl_in_reward", "use_kl_loss")


def test_gae_with_critic_disabled(make):
    issue_for(make({"algorithm.adv_estimator": "gae", "critic.enable": False}), "critic.enable", "gae")


def test_critic_warmup_without_critic(make):
    issue_for(make({"trainer.critic_warmup": 2}), "trainer.critic_warmup", "no critic")


def test_gdpo_needs_reward_keys(make):
    issue_for(make({"algorithm.adv_estimator": "gdpo"}), "algorithm.gdpo_reward_keys", "gdpo")
    cfg = make({"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": ["a", "b"], "algorithm.gdpo_reward_weights": [1.0]})
    issue_for(cfg, "algorithm.gdpo_reward_weights", "one weight per reward key")


def test_rollout_lengths_must_match_data(make):
    issue_for(make({f"{R}.response_length": 16}), f"{R}.response_length", "data.max_response_length=8")


def test_max_model_len_shorter_than_prompt_plus_response(make):
    issue_for(make({f"{R}.max_model_len": 39}), f"{R}.max_model_len", "40")


def test_max_num_batched_tokens_without_chunked_prefill(make):
    issue_for(make({f"{R}.max_num_batched_tokens": 32}), f"{R}.max_num_batched_tokens", "chunked prefill")
    no_issues(make({f"{R}.max_num_batched_tokens": 32, f"{R}.enable_chunked_prefill": True}))


def test_greedy_validation_with_n_above_1(make):
    issue_for(make({f"{R}.val_kwargs.n": 4}), f"{R}.val_kwargs.n", "identical")


def test_rollout_correction_needs_rollout_log_probs(make):
    cfg = make({"algorithm.rollout_correction.rollout_is": "token", f"{R}.calculate_log_probs": False})
    issue_for(cfg, f"{R}.calculate_log_probs", "rollout_is")


def test_rejection_thresholds_ordered(make):
    cfg = make({"algorithm.rollout_correction.rollout_rs": "token", "algorithm.rollout_correction.rollout_rs_threshold_lower": 3.0})
    issue_for(cfg, "algorithm.rollout_correction.rollout_rs_threshold_lower", "must not exceed the upper threshold 2.0")


def test_clip_cov_bounds_ordered(make):
    issue_for(make({f"{A}.policy_loss.clip_cov_lb": 6.0}), f"{A}.policy_loss.clip_cov_lb", "clip_cov_ub")


def test_dual_clip_c_above_1(make):
    issue_for(make({f"{A}.clip_ratio_c": 1.0}), f"{A}.clip_ratio_c", "> 1")


OB = "reward.reward_kwargs.overlong_buffer_cfg"


def test_overlong_buffer_needs_dapo_manager(make):
    on = {"enable": True, "len": 4, "penalty_factor": 1.0}
    issue_for(make({OB: on}), f"{OB}.enable", "dapo")
    cfg = make({OB: {**on, "len": 9}, "reward.reward_manager.name": "dapo"})
    issue_for(cfg, f"{OB}.len", "max_response_length=8")
    no_issues(make({OB: on, "reward.reward_manager.name": "dapo"}))
    issue_for(make({OB: {"enable": True}, "reward.reward_manager.name": "dapo"}), OB, "not given")
    issue_for(make({OB: {**on, "lenght": 3}, "reward.reward_manager.name": "dapo"}), OB, "unknown fields")


def test_custom_reward_file_must_exist(make, tmp_path):
    key = "reward.custom_reward_function.path"
    issue_for(make({key: str(tmp_path / "score.py")}), key, "does not exist")
    (tmp_path / "score.py").write_text("def compute_score(**kw):\n    return 0.0\n")
    no_issues(make({key: str(tmp_path / "score.py")}))


def test_legacy_reward_keys_move_to_reward_section(tmp_path):
    """verl 0.9 keeps custom_reward_function / reward_model.reward_manager as null legacy keys and
    moves a non-null value to reward.*; both places set differently is an error."""
    from megarl.config import ConfigError, load_config

    cfg = load_config(["custom_reward_function.path=/x/score.py", "custom_reward_function.name=f",
                       "reward_model.reward_manager=dapo"])
    assert cfg.reward.custom_reward_function.path == "/x/score.py" and cfg.reward.custom_reward_function.name == "f"
    assert cfg.reward.reward_manager.name == "dapo" and cfg.custom_reward_function.path is None
    with pytest.raises(ConfigError, match="conflicts with reward.reward_manager.name"):
        load_config(["reward_model.reward_manager=dapo", "reward.reward_manager.name=prime"])


def test_custom_dataset_class_needs_name(make, tmp_path):
    (tmp_path / "ds.py").write_text("")
    issue_for(make({"data.custom_cls.path": str(tmp_path / "ds.py")}), "data.custom_cls.name", "no dataset class name")


def test_betas_need_two_values(make):
    issue_for(make({f"{A}.optim.betas": [0.9]}), f"{A}.optim.betas", "exactly two")


def test_load_contents_must_be_saved(make):
    cfg = make({f"{A}.checkpoint.save_contents": ["model"], f"{A}.checkpoint.load_contents": ["model", "optimizer"]})
    issue_for(cfg, f"{A}.checkpoint.load_contents", "optimizer")


def test_dro_needs_beta(make):
    issue_for(make({f"{A}.policy_loss.loss_mode": "dro"}), f"{A}.policy_loss.dro_beta", "loss_mode=dro")
    no_issues(make({f"{A}.policy_loss.loss_mode": "dro", f"{A}.policy_loss.dro_beta": 0.1}))


def test_bypass_loss_needs_bypass_mode(make):
    issue_for(make({f"{A}.policy_loss.loss_mode": "bypass_mode"}), "algorithm.rollout_correction.bypass_mode", "rollout log-probs")
    no_issues(make({f"{A}.policy_loss.loss_mode": "bypass_mode", "algorithm.rollout_correction.bypass_mode": True}))


def test_rollout_rs_accepts_registry_options(make):
    rc = "algorithm.rollout_correction"
    no_issues(make({f"{rc}.rollout_rs": "seq_mean_k3", f"{rc}.rollout_rs_threshold": 0.01}))
    no_issues(make({f"{rc}.rollout_rs": "token_k1,seq_max_k2", f"{rc}.rollout_rs_threshold": "0.5_2.0,0.1"}))
    issue_for(make({f"{rc}.rollout_rs": "seq_mean_k9"}), f"{rc}.rollout_rs", "unknown name 'seq_mean_k9'", "seq_max_k3")
    # a divergence option has no default bound (only ratio options share rollout_is_threshold)
    issue_for(make({f"{rc}.rollout_rs": "seq_mean_k3"}), f"{rc}.rollout_rs_threshold", "must be set")
    issue_for(make({f"{rc}.rollout_rs": "token,seq_max_k2", f"{rc}.rollout_rs_threshold": "0.5_2.0,1_2"}), f"{rc}.rollout_rs_threshold", "one positive upper bound", "0.5_2.0")


def test_rollout_is_threshold_takes_a_number_or_lower_upper(make):
    rc = "algorithm.rollout_correction"
    no_issues(make({f"{rc}.rollout_is": "token", f"{rc}.rollout_is_threshold": "0.5_2.0"}))
    no_issues(make({f"{rc}.rollout_is": "token", f"{rc}.rollout_is_threshold": 3}))
    issue_for(make({f"{rc}.rollout_is_threshold": "2.0_0.5"}), f"{rc}.rollout_is_threshold", "0 < lower <= upper")
    issue_for(make({f"{rc}.rollout_is_threshold": "two"}), f"{rc}.rollout_is_threshold", "cannot parse")
    issue_for(make({f"{rc}.rollout_is_threshold": -1.0}), f"{rc}.rollout_is_threshold", ">")


def test_unimplemented_features_refused_up_front(make, tmp_path):
    issue_for(make({f"{R}.multi_turn.function_tool_path": "tools.py"}), f"{R}.multi_turn.function_tool_path", "not implemented")


def test_optimal_token_baseline_needs_sum_pi_squared(make):
    otb = {"algorithm.adv_estimator": "optimal_token_baseline"}
    issue_for(make(otb), f"{A}.calculate_sum_pi_squared", "optimal_token_baseline", f"{A}.calculate_sum_pi_squared=true")
    no_issues(make({**otb, f"{A}.calculate_sum_pi_squared": True}))
    no_issues(make({f"{A}.calculate_sum_pi_squared": True}))  # computed but unused: allowed
    bypass = {**otb, f"{A}.calculate_sum_pi_squared": True, "algorithm.rollout_correction.bypass_mode": True,
              f"{R}.calculate_log_probs": True}
    issue_for(make(bypass), "algorithm.rollout_correction.bypass_mode", "old-log-prob pass", "optimal_token_baseline")
