"""MoE routing replay rules (verl's `megatron.router_replay.mode`, `rollout.enable_rollout_routing_replay`):
which passes have routes to replay, and the Megatron router options that would bypass or undo a replay.
That the model has experts is checked with its config.json (megarl.config.rules.model)."""

from __future__ import annotations

from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.roles import ref_enabled
from megarl.config.rules.view import View

ACTOR_MODE = "actor_rollout_ref.actor.megatron.router_replay.mode"
REF_MODE = "actor_rollout_ref.ref.megatron.router_replay.mode"
RECORD = "actor_rollout_ref.rollout.enable_rollout_routing_replay"

# TransformerConfig fields that bypass a replayed top-k (the fused router returns before it) or change the
# experts after it (token dropping, random or jittered routing): value -> why, for the values that do.
_BYPASS = {
    "moe_router_fusion": "transformer-engine's fused router computes its own top-k and never consults the replay",
    "moe_expert_capacity_factor": "token dropping removes replayed experts after the replay (vLLM never drops)",
    "moe_router_force_load_balancing": "random logits route every token anew",
    "moe_input_jitter_eps": "jitter changes the router input, not the replayed experts: set it to null",
}


def replay_modes(v: View) -> Iterator[Issue]:
    actor, record = v.get(ACTOR_MODE), v.get(RECORD)
    if actor == "R3" and not record:
        yield Issue(ACTOR_MODE, actor, "R3 replays the experts vLLM chose, which the rollout records only with "
                    f"{RECORD}=true", f"set {RECORD}=true")
    if actor == "R2" and record:
        yield Issue(RECORD, record, f"{ACTOR_MODE}=R2 replays the routes of the old-log-prob pass, not the rollout's "
                    "(verl refuses this combination too)", f"set {ACTOR_MODE}=R3 to replay vLLM's routes, or {RECORD}=false")
    if actor == "R2" and v.get("algorithm.rollout_correction.bypass_mode"):
        yield Issue(ACTOR_MODE, actor, "R2 records the routes in the old-log-prob pass, which "
                    "algorithm.rollout_correction.bypass_mode=true skips", f"set {ACTOR_MODE}=R3 (with {RECORD}=true) or disabled")
    if not ref_enabled(v):
        return
    ref = v.get(REF_MODE)
    if ref == "R2" and actor != "R2":
        yield Issue(REF_MODE, ref, f"R2 replays the routes the actor's old-log-prob pass records, which it records only "
                    f"with {ACTOR_MODE}=R2", f"set {REF_MODE} to {actor} (the actor's mode) or disabled")
    elif ref == "R3" and not record and actor != "R3":
        yield Issue(REF_MODE, ref, f"R3 replays the experts vLLM chose, which the rollout records only with {RECORD}=true",
                    f"set {RECORD}=true, or {REF_MODE}=disabled")


def replay_bypass(v: View) -> Iterator[Issue]:
    """A replaying role's router options that would skip or undo the replay."""
    for mode_key in (ACTOR_MODE, REF_MODE):
        if v.get(mode_key) == "disabled" or (mode_key == REF_MODE and not ref_enabled(v)):
            continue
        section = mode_key.rsplit(".", 2)[0]
        overrides = v.get(f"{section}.override_transformer_config") or {}
        for name, why in _BYPASS.items():
            if overrides.get(name) not in (None, False):
                yield Issue(f"{section}.override_transformer_config.{name}", overrides[name],
                            f"with {mode_key}={v.get(mode_key)}: {why}",
                            f"remove {section}.override_transformer_config.{name}, or set {mode_key}=disabled")
        if overrides.get("moe_router_load_balancing_type") == "sinkhorn":
            yield Issue(f"{section}.override_transformer_config.moe_router_load_balancing_type", "sinkhorn",
                        f"with {mode_key}={v.get(mode_key)}: the sinkhorn router has no replay",
                        "remove it (the model's own load-balancing type applies)")


RULES = (replay_modes, replay_bypass)
