"""Batch-size rules: mini/micro batches against train_batch_size, rollout.n and DP size.

Units: train_batch_size and ppo_mini_batch_size count prompts; every prompt yields
rollout.n responses, and the responses of a mini-batch are split evenly over the
data-parallel ranks (dp = world / (tp * pp * cp)) before micro-batching.
"""

from __future__ import annotations

from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.roles import ACTOR, CRITIC, REF, Role, critic_enabled, ref_enabled, role_layout
from megarl.config.rules.view import View


def _seq_len(v: View) -> int:
    return v.get("data.max_prompt_length") + v.get("data.max_response_length")


def _ppo_batches(v: View, section: str, role: Role) -> Iterator[Issue]:
    """PPO update batching of the actor or critic (`section` holds ppo_mini_batch_size etc.)."""
    train = v.get("data.train_batch_size")
    # responses per prompt: the unit of ppo_mini_batch_size (actor/critic.rollout_n follow rollout.n)
    n_key = f"{section}.rollout_n"
    n = v.get(n_key)
    mini_key = f"{section}.ppo_mini_batch_size"
    mini = v.get(mini_key)
    if train % mini != 0:
        yield Issue(
            mini_key, mini,
            f"must divide data.train_batch_size={train} (both count prompts; each step makes train/mini optimizer updates)",
            f"pick a divisor of {train}, e.g. {mini_key}={_largest_divisor_at_most(train, mini)}",
        )
    parallel = role_layout(v, role)
    if parallel.problems():
        return  # the layout rule reports them
    dp = parallel.dp
    mini_responses = mini * n
    if mini_responses % dp != 0:
        yield Issue(
            mini_key, mini,
            f"{mini} prompts x rollout.n={n} = {mini_responses} responses do not split evenly over {dp} data-parallel ranks",
            f"make {mini_key} * {n_key} a multiple of dp={dp} (dp = world / (tp*pp*cp))",
        )
        return
    per_rank = mini_responses // dp
    if v.get(f"{section}.use_dynamic_bsz"):
        budget_key = f"{section}.ppo_max_token_len_per_gpu"
        if v.get(budget_key) * parallel.cp < _seq_len(v):
            yield _budget_issue(v, budget_key, parallel.cp)
        return
    micro_key = f"{section}.ppo_micro_batch_size_per_gpu"
    micro = v.get(micro_key)
    if micro is None:
        yield Issue(micro_key, None, "required when use_dynamic_bsz is false", f"set {micro_key} (responses per rank per forward/backward), e.g. {min(per_rank, 8)}")
    elif micro > per_rank:
        yield Issue(
            micro_key, micro,
            f"larger than the per-rank mini-batch: {mini} prompts x n={n} / dp={dp} = {per_rank} responses",
            f"set {micro_key} <= {per_rank}",
        )
    elif per_rank % micro != 0:
        yield Issue(
            micro_key, micro,
            f"must divide the per-rank mini-batch of {per_rank} responses ({mini} prompts x n={n} / dp={dp}) into equal micro-batches",
            f"pick a divisor of {per_rank}, e.g. {micro_key}={_largest_divisor_at_most(per_rank, micro)}",
        )


def _largest_divisor_at_most(total: int, cap: int) -> int:
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def _budget_issue(v: View, key: str, cp: int) -> Issue:
    """A micro-batch holds `key` x cp tokens (each of the cp context-parallel ranks computes 1/cp, as verl)."""
    need = _seq_len(v)
    times_cp = f" x context_parallel_size={cp}" if cp > 1 else ""
    return Issue(
        key, v.get(key),
        f"token budget{times_cp} is smaller than one full sequence (data.max_prompt_length + max_response_length = {need})",
        f"set {key} >= {-(-need // cp)}",
    )


def _log_prob_batches(v: View, section: str, role: Role) -> Iterator[Issue]:
    """Forward-only micro-batching (old log-prob in rollout.*, reference in ref.*) of `role`'s model."""
    if v.get(f"{section}.log_prob_use_dynamic_bsz"):
        key = f"{section}.log_prob_max_token_len_per_gpu"
        cp = role_layout(v, role).cp
        if v.get(key) * cp < _seq_len(v):
            yield _budget_issue(v, key, cp)
        return
    key = f"{section}.log_prob_micro_batch_size_per_gpu"
    if v.get(key) is None:
        yield Issue(key, None, "required when log_prob_use_dynamic_bsz is false", f"set {key} (responses per rank per forward), e.g. 16")


def actor_batches(v: View) -> Iterator[Issue]:
    yield from _ppo_batches(v, "actor_rollout_ref.actor", ACTOR)


def critic_batches(v: View) -> Iterator[Issue]:
    if critic_enabled(v):
        yield from _ppo_batches(v, "critic", CRITIC)
        if v.get("critic.use_dynamic_bsz"):  # the value forward (compute_values) has its own budget
            key = "critic.forward_max_token_len_per_gpu"
            cp = role_layout(v, CRITIC).cp
            if v.get(key) * cp < _seq_len(v):
                yield _budget_issue(v, key, cp)


def old_log_prob_batches(v: View) -> Iterator[Issue]:
    yield from _log_prob_batches(v, "actor_rollout_ref.rollout", ACTOR)


def ref_batches(v: View) -> Iterator[Issue]:
    if ref_enabled(v):
        yield from _log_prob_batches(v, "actor_rollout_ref.ref", REF)


RULES = (actor_batches, critic_batches, old_log_prob_batches, ref_batches)
