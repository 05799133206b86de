"""Megatron-FSDP (`megatron.use_megatron_fsdp`, megarl.models.data_parallel): what megarl's
FSDP path does not cover yet is refused by key. Its parameters live as DTensor shards, which megarl's
offload (moves DDP's buffers) and LoRA (adapters on DDP's parameters) do not read. Checkpoints are
written in Megatron-FSDP's own DTensor format (megarl.workers.megatron.fsdp_checkpoint); resuming one
written with the other wrapper is refused when the trainer picks it (megarl.trainer.resume_config)."""

from __future__ import annotations

from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.roles import critic_enabled
from megarl.config.rules.view import View

_TRAINED = ("actor_rollout_ref.actor.megatron", "critic.megatron")


def megatron_fsdp(v: View) -> Iterator[Issue]:
    for section in _TRAINED:
        key = f"{section}.use_megatron_fsdp"
        if not v.get(key) or (section == "critic.megatron" and not critic_enabled(v)):
            continue
        off = f"or set {key}=false"
        if not v.get(f"{section}.use_distributed_optimizer"):
            yield Issue(f"{section}.use_distributed_optimizer", False, f"{key}=true shards the optimizer state over DP "
                        "(megatron-core's FSDP optimizer is the distributed one)",
                        f"set {section}.use_distributed_optimizer=true, {off}")
        for name in ("param_offload", "grad_offload", "optimizer_offload"):
            if v.get(f"{section}.{name}"):
                yield Issue(f"{section}.{name}", True, f"not implemented with {key}=true (megarl offloads DDP's "
                            "buffers; Megatron-FSDP's are DTensor shards)", f"set {section}.{name}=false, {off}")
        if section.startswith("actor_rollout_ref") and v.get("actor_rollout_ref.model.lora.rank"):
            yield Issue("actor_rollout_ref.model.lora.rank", v.get("actor_rollout_ref.model.lora.rank"),
                        f"LoRA is not implemented with {key}=true", f"set actor_rollout_ref.model.lora.rank=0, {off}")


RULES = (megatron_fsdp,)
