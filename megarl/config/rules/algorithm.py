"""Algorithm, rollout and reward rules that span several keys."""

from __future__ import annotations

import os
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.names import GROUP_ADV_ESTIMATORS, ROLLOUT_RS_OPTIONS, ROLLOUT_RS_RATIO_OPTIONS
from megarl.config.schema.algorithm import parse_is_threshold, parse_rs_thresholds
from megarl.config.schema.reward import OVERLONG_KEY, overlong_buffer
from megarl.config.rules.roles import critic_enabled
from megarl.config.rules.view import Skip, View

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"


def group_size(v: View) -> Iterator[Issue]:
    est = v.get("algorithm.adv_estimator")
    n = v.get(f"{ROLLOUT}.n")
    # distillation without the task reward trains on the teacher's loss alone: the advantages go unused
    # (verl's on-policy distillation example runs grpo with n=1)
    if v.get("distillation.enabled") and not v.get("distillation.distillation_loss.use_task_rewards"):
        return
    if est in GROUP_ADV_ESTIMATORS and n < 2:
        yield Issue(
            f"{ROLLOUT}.n", n,
            f"algorithm.adv_estimator={est} compares the responses of one prompt and needs a group of >= 2",
            f"set {ROLLOUT}.n to 2 or more (e.g. 8), or use algorithm.adv_estimator=gae / remax / reinforce_plus_plus",
        )
    elif est in GROUP_ADV_ESTIMATORS and not v.get(f"{ROLLOUT}.do_sample"):
        yield Issue(
            f"{ROLLOUT}.do_sample", False,
            f"greedy decoding makes all n={n} responses of a prompt identical, so {est} advantages are all zero",
            f"set {ROLLOUT}.do_sample=true",
        )
    if v.get("algorithm.filter_groups.enable") and n < 2:
        yield Issue("algorithm.filter_groups.enable", True, "filters groups of rollout.n responses; needs rollout.n >= 2", f"set {ROLLOUT}.n >= 2 or disable filter_groups")


def kl_sources(v: View) -> Iterator[Issue]:
    if v.get("algorithm.use_kl_in_reward") and v.get(f"{ACTOR}.use_kl_loss"):
        yield Issue(
            "algorithm.use_kl_in_reward", True,
            f"{ACTOR}.use_kl_loss is also true: the KL to the reference would be applied twice",
            f"use one: algorithm.use_kl_in_reward=false (GRPO style KL loss) or {ACTOR}.use_kl_loss=false (PPO style KL in reward)",
        )


def critic_needed(v: View) -> Iterator[Issue]:
    if v.get("algorithm.adv_estimator") == "gae" and v.get("critic.enable") is False:
        yield Issue("critic.enable", False, "algorithm.adv_estimator=gae needs the critic's values", "set critic.enable=null (auto) or true, or choose another estimator")
    warmup = v.get("trainer.critic_warmup")
    if warmup > 0 and not critic_enabled(v):
        yield Issue("trainer.critic_warmup", warmup, "there is no critic to warm up (critic is off for this estimator)", "set trainer.critic_warmup=0")


def gdpo(v: View) -> Iterator[Issue]:
    if v.get("algorithm.adv_estimator") != "gdpo":
        return
    keys = v.get("algorithm.gdpo_reward_keys")
    if not keys:
        yield Issue("algorithm.gdpo_reward_keys", keys, "adv_estimator=gdpo needs the reward components to normalize", "set algorithm.gdpo_reward_keys=[name1,name2]")
        return
    weights = v.get("algorithm.gdpo_reward_weights")
    if weights is not None and len(weights) != len(keys):
        yield Issue("algorithm.gdpo_reward_weights", weights, f"needs one weight per reward key ({len(keys)})", "give as many weights as gdpo_reward_keys, or null")


def optimal_token_baseline(v: View) -> Iterator[Issue]:
    if v.get("algorithm.adv_estimator") != "optimal_token_baseline":
        return
    if not v.get(f"{ACTOR}.calculate_sum_pi_squared"):
        yield Issue(
            f"{ACTOR}.calculate_sum_pi_squared", False,
            "algorithm.adv_estimator=optimal_token_baseline weighs tokens by sum_v pi_v^2, which the actor "
            "computes only when asked",
            f"set {ACTOR}.calculate_sum_pi_squared=true",
        )
    if v.get("algorithm.rollout_correction.bypass_mode"):
        yield Issue(
            "algorithm.rollout_correction.bypass_mode", True,
            "bypass mode skips the actor's old-log-prob pass, which computes sum_pi_squared for "
            "algorithm.adv_estimator=optimal_token_baseline",
            "set algorithm.rollout_correction.bypass_mode=false, or choose another estimator",
        )


def lengths_copy(v: View) -> Iterator[Issue]:
    for rollout_key, data_key in (("prompt_length", "max_prompt_length"), ("response_length", "max_response_length")):
        got, want = v.get(f"{ROLLOUT}.{rollout_key}"), v.get(f"data.{data_key}")
        if got != want:
            yield Issue(
                f"{ROLLOUT}.{rollout_key}", got,
                f"differs from data.{data_key}={want}; batches are padded to the data lengths",
                f"leave {ROLLOUT}.{rollout_key} at its default ${{data.{data_key}}} and set data.{data_key} instead",
            )


def vllm_limits(v: View) -> Iterator[Issue]:
    need = v.get("data.max_prompt_length") + v.get("data.max_response_length")
    max_len_key = f"{ROLLOUT}.max_model_len"
    max_len = v.get(max_len_key)
    if max_len is not None and max_len < need:
        yield Issue(max_len_key, max_len, f"shorter than max_prompt_length + max_response_length = {need}", f"set {max_len_key} >= {need} or null")
    context = max_len or need
    key = f"{ROLLOUT}.max_num_batched_tokens"
    if not v.get(f"{ROLLOUT}.enable_chunked_prefill") and v.get(key) < context:
        yield Issue(key, v.get(key), f"without chunked prefill vLLM needs it >= the context length {context}", f"set {key} >= {context} or {ROLLOUT}.enable_chunked_prefill=true")


def sampling(v: View) -> Iterator[Issue]:
    val = f"{ROLLOUT}.val_kwargs"
    if v.get(f"{val}.n") > 1 and not v.get(f"{val}.do_sample"):
        yield Issue(f"{val}.n", v.get(f"{val}.n"), "greedy validation (do_sample=false) gives n identical responses", f"set {val}.do_sample=true or {val}.n=1")


def policy_loss(v: View) -> Iterator[Issue]:
    lb, ub = v.get(f"{ACTOR}.policy_loss.clip_cov_lb"), v.get(f"{ACTOR}.policy_loss.clip_cov_ub")
    if lb >= ub:
        yield Issue(f"{ACTOR}.policy_loss.clip_cov_lb", lb, f"must be below clip_cov_ub={ub}", "set clip_cov_lb < clip_cov_ub")


def loss_mode_needs(v: View) -> Iterator[Issue]:
    mode = v.get(f"{ACTOR}.policy_loss.loss_mode")
    if mode == "dro" and v.get(f"{ACTOR}.policy_loss.dro_beta") is None:
        yield Issue(f"{ACTOR}.policy_loss.dro_beta", None, "loss_mode=dro needs the penalty weight", f"set {ACTOR}.policy_loss.dro_beta to a value > 0")
    if mode == "bypass_mode" and not v.get("algorithm.rollout_correction.bypass_mode"):
        yield Issue(
            "algorithm.rollout_correction.bypass_mode", False,
            "policy_loss.loss_mode=bypass_mode computes the loss against rollout log-probs, which only bypass mode provides",
            "set algorithm.rollout_correction.bypass_mode=true (or choose another loss_mode)",
        )


def rollout_correction(v: View) -> Iterator[Issue]:
    rc = "algorithm.rollout_correction"
    used = [k for k in ("rollout_is", "rollout_rs") if v.get(f"{rc}.{k}") is not None]
    if v.get(f"{rc}.bypass_mode"):
        used.append("bypass_mode")
    if used and not v.get(f"{ROLLOUT}.calculate_log_probs"):
        yield Issue(f"{ROLLOUT}.calculate_log_probs", False, f"{rc}.{used[0]} needs vLLM's rollout log-probs", f"set {ROLLOUT}.calculate_log_probs=true")
    yield from _rollout_thresholds(v, rc)


def _rollout_thresholds(v: View, rc: str) -> Iterator[Issue]:
    """Parse the threshold specs with the parsers the algorithm uses (float or "lower_upper")."""
    is_spec = v.get(f"{rc}.rollout_is_threshold")
    try:
        parse_is_threshold(is_spec)
    except ValueError as exc:
        yield Issue(f"{rc}.rollout_is_threshold", is_spec, _problem(exc), 'give an upper bound (2.0) or "lower_upper" (e.g. "0.5_2.0")')
        return
    rs = v.get(f"{rc}.rollout_rs")
    if rs is None:
        return
    options = [o.strip() for o in rs.split(",") if o.strip()]
    bad = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if bad or not options:
        yield Issue(f"{rc}.rollout_rs", rs, f"unknown name {bad[0]!r}" if bad else "empty", f"use one or more (comma-separated) of: {', '.join(ROLLOUT_RS_OPTIONS)}, or null")
        return
    rs_spec = v.get(f"{rc}.rollout_rs_threshold")
    ratio_only = all(o in ROLLOUT_RS_RATIO_OPTIONS for o in options)
    if rs_spec is None and ratio_only:
        rs_spec = is_spec  # the ratio options share the IS bound (see rollout_correction.py)
    try:
        bounds = parse_rs_thresholds(options, rs_spec)
    except ValueError as exc:
        yield Issue(f"{rc}.rollout_rs_threshold", v.get(f"{rc}.rollout_rs_threshold"), _problem(exc),
                    'one spec per rollout_rs option, comma-separated: "lower_upper" ratio bounds for token/sequence/geometric/*_k1, one upper bound for the others')
        return
    lower = v.get(f"{rc}.rollout_rs_threshold_lower")
    for opt, (_, upper) in bounds.items():
        if lower is not None and opt in ROLLOUT_RS_RATIO_OPTIONS and lower > upper:
            yield Issue(f"{rc}.rollout_rs_threshold_lower", lower, f"must not exceed the upper threshold {upper} of rollout_rs={opt}", "lower rollout_rs_threshold_lower or raise rollout_rs_threshold")
            return


def _problem(exc: ValueError) -> str:
    """The algorithm's message without its own key prefix (the Issue names the key)."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("algorithm.") and ": " in text else text


def reward(v: View) -> Iterator[Issue]:
    key = f"{OVERLONG_KEY}"
    try:
        buffer = overlong_buffer(v.get("reward.reward_kwargs"))
    except ValueError as error:
        yield Issue(key, v.get("reward.reward_kwargs").get("overlong_buffer_cfg"), str(error),
                    f"give {key} as {{enable: true, len: 4, penalty_factor: 1.0, log: false}}")
        return
    if buffer is not None and buffer.enable:
        if v.get("reward.reward_manager.name") != "dapo":
            yield Issue(f"{key}.enable", True, "the overlong penalty is applied by the dapo reward manager", "set reward.reward_manager.name=dapo")
        resp = v.get("data.max_response_length")
        if buffer.len > resp:
            yield Issue(f"{key}.len", buffer.len, f"longer than data.max_response_length={resp}", f"set {key}.len <= {resp}")


def _python_file(v: View, path_key: str, name_key: str, what: str) -> Iterator[Issue]:
    path = v.path(path_key)
    if path is None:
        return
    if not os.path.isfile(path):
        yield Issue(path_key, v.get(path_key), f"{what} file does not exist", f"point {path_key} at an existing .py file, or null")
    if not v.get(name_key):
        yield Issue(name_key, v.get(name_key), f"{path_key} is set but no {what} name is given", f"set {name_key}")


def plugin_files(v: View) -> Iterator[Issue]:
    yield from _python_file(v, "reward.custom_reward_function.path", "reward.custom_reward_function.name", "reward function")
    yield from _python_file(v, "data.custom_cls.path", "data.custom_cls.name", "dataset class")
    yield from _python_file(v, "data.sampler.class_path", "data.sampler.class_name", "sampler class")


def optim(v: View) -> Iterator[Issue]:
    for section in (f"{ACTOR}", "critic"):
        try:
            yield from _optim_section(v, section)
        except Skip:
            continue


def _optim_section(v: View, section: str) -> Iterator[Issue]:
    key = f"{section}.optim.betas"
    betas = v.get(key)
    if len(betas) != 2:
        yield Issue(key, betas, "needs exactly two values (beta1, beta2)", f"set {key}=[0.9,0.999]")
    save, load = v.get(f"{section}.checkpoint.save_contents"), v.get(f"{section}.checkpoint.load_contents")
    missing = [c for c in load if c not in save]
    if missing:
        yield Issue(f"{section}.checkpoint.load_contents", load, f"{missing} are never saved (save_contents={save})", f"add them to {section}.checkpoint.save_contents or drop them from load_contents")


RULES = (group_size, kl_sources, critic_needed, gdpo, optimal_token_baseline, lengths_copy, vllm_limits, sampling, policy_loss, loss_mode_needs, rollout_correction, reward, plugin_files, optim)
