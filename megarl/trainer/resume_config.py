"""What changed since a checkpoint, and what resuming does about it — never silently.

Every checkpoint stores the run's typed config and its models' ``config.json``
(``run_record`` -> ``run_config.json``). On resume ``check_resume_config`` compares them
with the current run, key by key of the current typed config (a key megarl does not implement,
which older checkpoints also stored, has no effect to report):

* refused (``ConfigError`` naming key, old and new value): another ``model.path`` or other
  model shapes (``config.json`` / ``model.override_config``): the checkpoint's weights would
  silently win over the new model, or fail deep in Megatron with "Global shape mismatch";
  another ``optim.optimizer`` (its state cannot load); a critic the checkpoint lacks; while
  ``checkpoint.load_contents`` has ``optimizer``: another ``megatron.use_distributed_optimizer``,
  or another layout (TP/PP/VPP/CP/EP) for a distributed-optimizer state saved ``dp_reshardable``
  (the workers refuse both when loading, megarl.workers.megatron.checkpoint; decided here, before
  they start, so the verdict printed is the one enforced);
* refused by ``refuse_fsdp_resume`` (run first, also without a stored config): another
  ``megatron.use_megatron_fsdp``, and a Megatron-FSDP checkpoint's weights at another layout;
* the lr schedule (``optim.lr``, warmup, decay, ``weight_decay``, ...): applied when
  ``optim.use_checkpoint_opt_param_scheduler=false`` (verl's default), kept from the
  checkpoint when true — said either way;
* ``algorithm.kl_ctrl.kl_coef``: applied for the fixed controller, kept from the checkpoint
  by the adaptive one (it continues from its stored coefficient);
* anything else: applied (the workers are built from the current config), listed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from megarl.config.errors import ConfigError, Issue
from megarl.config.read import to_dict
from megarl.config.schema.root import MegaRLConfig

NOT_COMPARED = ("trainer.resume_mode", "trainer.resume_from_path")
ROLES = ("actor_rollout_ref.actor", "critic")
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")
SCHEDULE = ("lr", "min_lr", "min_lr_ratio", "lr_warmup_init", "lr_warmup_steps", "lr_warmup_steps_ratio", "lr_decay_style",
            "lr_decay_steps", "lr_wsd_decay_style", "lr_wsd_decay_steps", "weight_decay", "weight_decay_incr_style",
            "total_training_steps")
# config.json fields that do not describe the model (who wrote it, storage dtype)
_NOT_SHAPE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache")


def _model_config(path: str | None) -> dict[str, Any] | None:
    file = os.path.join(os.path.expanduser(str(path)), "config.json") if path else None
    if file is None or not os.path.isfile(file):
        return None
    with open(file) as handle:
        return json.load(handle)


def run_record(cfg: MegaRLConfig, use_critic: bool) -> dict[str, Any]:
    """What a checkpoint stores about its run: the typed config, critic or not, models' config.json."""
    paths = {MODEL_KEYS[0]: cfg.actor_rollout_ref.model.path, MODEL_KEYS[1]: cfg.critic.model.path}
    keys = MODEL_KEYS if use_critic else MODEL_KEYS[:1]
    return {
        "format": 1,
        "config": to_dict(cfg),
        "critic": bool(use_critic),
        "model_configs": {key: _model_config(paths[key]) for key in keys},
    }


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _same_path(a: Any, b: Any) -> bool:
    norm = lambda p: os.path.realpath(os.path.expanduser(str(p))) if p else p  # noqa: E731
    return norm(a) == norm(b)


def _start_over(ckpt: str) -> str:
    return f"or start a new run with trainer.resume_mode=disable or another trainer.default_local_dir (not {ckpt}'s)"


def _refusals(old: dict, new: dict, new_tree: dict, record: dict, use_critic: bool, ckpt: str) -> list[Issue]:
    issues = []
    roles = ["actor_rollout_ref"] + (["critic"] if use_critic and record["critic"] else [])
    for role in roles:
        key = f"{role}.model.path"
        if not _same_path(old.get(key), new.get(key)):
            issues.append(Issue(key, new.get(key), (
                f"differs from the checkpoint {ckpt} (it was {old.get(key)!r}): its weights and optimizer state belong "
                "to that model and would silently replace the new one"),
                f"set {key}={old.get(key)} to continue that run, {_start_over(ckpt)}"))
            continue
        saved, now = (record.get("model_configs") or {}).get(key), _model_config(new.get(key))
        if saved is not None and now is not None:
            diffs = [f"{f}: {saved.get(f)!r} -> {now.get(f)!r}" for f in sorted(set(saved) | set(now))
                     if f not in _NOT_SHAPE and saved.get(f) != now.get(f)]
            if diffs:
                issues.append(Issue(key, new.get(key), (
                    f"the model there is not the one checkpointed in {ckpt}; its config.json changed: {'; '.join(diffs)}"),
                    f"restore that model's files, {_start_over(ckpt)}"))
        override = f"{role}.model.override_config"
        was, now_o = _at(record["config"], override), _at(new_tree, override)
        if (was or {}) != (now_o or {}):
            issues.append(Issue(override, now_o, (
                f"differs from the checkpoint {ckpt} (it was {was!r}): the checkpointed weights have the old model's shapes"),
                f"set it back to continue that run, {_start_over(ckpt)}"))
    for role in ROLES if use_critic and record["critic"] else ROLES[:1]:
        key = f"{role}.optim.optimizer"
        if old.get(key) != new.get(key):
            issues.append(Issue(key, new.get(key), f"differs from the checkpoint {ckpt} (it was {old.get(key)!r}): the "
                                                   "checkpointed optimizer state is that optimizer's",
                                f"set {key}={old.get(key)} to continue that run, {_start_over(ckpt)}"))
    for role in ROLES if use_critic and record["critic"] else ROLES[:1]:
        issues += _optimizer_state_refusals(old, new, role, ckpt)
    if use_critic and not record["critic"]:
        issues.append(Issue("critic.enable", new.get("critic.enable"), (
            f"this run trains a critic (algorithm.adv_estimator={new.get('algorithm.adv_estimator')}), but the checkpoint "
            f"{ckpt} has none (it was written with algorithm.adv_estimator={old.get('algorithm.adv_estimator')})"),
            f"resume with the checkpoint's algorithm.adv_estimator / critic.enable, {_start_over(ckpt)}"))
    return issues


LAYOUT = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
          "context_parallel_size", "expert_model_parallel_size")


def _optimizer_state_refusals(old: dict, new: dict, role: str, ckpt: str) -> list[Issue]:
    """The optimizer state of ``role`` that the workers could not load (mirrors their check)."""
    contents = f"{role}.checkpoint.load_contents"
    if "optimizer" not in (new.get(contents) or []):
        return []
    skip = f"or leave optimizer out of {contents}"
    key = f"{role}.megatron.use_distributed_optimizer"
    if bool(old.get(key)) != bool(new.get(key)):
        return [Issue(key, new.get(key), f"differs from the checkpoint {ckpt} (it was {old.get(key)!r}): its optimizer "
                                         f"state was written {'with' if old.get(key) else 'without'} the distributed "
                                         "optimizer and cannot load into the other", f"set {key}={old.get(key)} to "
                                         f"continue that run, {skip}")]
    resharded = f"{role}.megatron.dist_ckpt_optim_fully_reshardable"
    if not old.get(key) or old.get(resharded):
        return []
    changed = [f"{role}.megatron.{k}" for k in LAYOUT if (old.get(f"{role}.megatron.{k}") or 1) != (new.get(f"{role}.megatron.{k}") or 1)]
    if not changed:
        return []
    return [Issue(changed[0], new.get(changed[0]), (
        f"differs from the checkpoint {ckpt} (it was {old.get(changed[0])!r}; changed: {', '.join(changed)}): its "
        f"distributed-optimizer state was saved dp_reshardable ({resharded}=false), which loads only at the layout it "
        "was saved in"), f"resume at that layout, {skip} (save with {resharded}=true to change layouts)")]


def _at(tree: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _verdict(key: str, new: dict) -> str:
    for role in ROLES:
        prefix = f"{role}.optim."
        if key.startswith(prefix) and key[len(prefix):] in SCHEDULE:
            flag = f"{prefix}use_checkpoint_opt_param_scheduler"
            if new.get(flag):
                return f"not applied: the checkpoint's lr schedule is kept ({flag}=true)"
            return f"applied ({flag}=false: the lr schedule is rebuilt from this config at the checkpoint's step)"
    if key == "algorithm.kl_ctrl.kl_coef" and new.get("algorithm.kl_ctrl.type") == "adaptive":
        return "not applied: the adaptive KL controller continues from the checkpoint's coefficient"
    return "applied"


def refuse_fsdp_resume(record: dict[str, Any] | None, cfg: MegaRLConfig, use_critic: bool, ckpt: str) -> None:
    """Refuse ``ckpt`` when a trained role's data-parallel wrapper (``megatron.use_megatron_fsdp``) differs
    from the one it was saved with (``record``: its run_record; None, or a config without the key: written
    before Megatron-FSDP existed, so DDP): DDP's dist checkpoint and FSDP's DTensor shards do not load into
    each other; and a Megatron-FSDP checkpoint whose weights are loaded (``checkpoint.load_contents`` has
    model or optimizer) at another TP/PP/VPP/CP/EP layout: its DTensor shards load only at the layout that
    wrote them (DDP's dist checkpoint reshards). Before any worker starts, not deep in the load (the workers
    refuse both too, megarl.workers.megatron.checkpoint)."""
    saved = _flatten(record["config"]) if record is not None else {}
    trained = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor)]
    trained += [("critic", cfg.critic)] if use_critic else []
    issues = []
    for role, section in trained:
        key = f"{role}.megatron.use_megatron_fsdp"
        was = bool(saved.get(key, False))
        if was != section.megatron.use_megatron_fsdp:
            wrapper = lambda fsdp: "Megatron-FSDP's DTensor shards" if fsdp else "megatron DDP's dist checkpoint"  # noqa: E731
            issues.append(Issue(key, section.megatron.use_megatron_fsdp, (
                f"differs from the checkpoint {ckpt} (it was {str(was).lower()}: {wrapper(was)}), which this run "
                f"({wrapper(section.megatron.use_megatron_fsdp)}) cannot load"),
                f"set {key}={str(was).lower()} to continue that run, or set trainer.resume_mode=disable (start over), "
                "or another trainer.default_local_dir"))
        elif was and (role == ROLES[0] or record["critic"]) and {"model", "optimizer"} & set(section.checkpoint.load_contents):
            issues += _fsdp_layout_refusal(saved, role, section.megatron, ckpt)
    if issues:
        raise ConfigError(issues)


def _fsdp_layout_refusal(saved: dict[str, Any], role: str, megatron: Any, ckpt: str) -> list[Issue]:
    """The layout keys of ``role`` (``megatron``: its typed section) that differ from the Megatron-FSDP
    checkpoint's (``saved``: its flattened config); unset VPP is 1, as the workers count it."""
    old = {k: saved.get(f"{role}.megatron.{k}") or 1 for k in LAYOUT}
    new = {k: getattr(megatron, k) or 1 for k in LAYOUT}
    changed = [k for k in LAYOUT if old[k] != new[k]]
    if not changed:
        return []
    first = f"{role}.megatron.{changed[0]}"
    return [Issue(first, new[changed[0]], (
        f"differs from the checkpoint {ckpt}, written with Megatron-FSDP at another layout ("
        + ", ".join(f"{role}.megatron.{k}: {old[k]} -> {new[k]}" for k in changed)
        + "): its DTensor shards load only at the TP/PP/VPP/CP/EP layout that wrote them"),
        "set " + " ".join(f"{role}.megatron.{k}={old[k]}" for k in changed) + " to continue that run, or set "
        f"trainer.resume_mode=disable (start over), or another trainer.default_local_dir (or leave model and "
        f"optimizer out of {role}.checkpoint.load_contents)")]


def check_resume_config(record: dict[str, Any], cfg: MegaRLConfig, use_critic: bool, ckpt: str) -> list[str]:
    """Compare the checkpoint's ``run_record`` with the current ``cfg``.

    Returns one line per changed key: ``key: old -> new: applied | not applied (why)``.
    Raises ConfigError for the changes that cannot apply (see the module docstring).
    """
    new_tree = to_dict(cfg)
    old, new = _flatten(record["config"]), _flatten(new_tree)
    issues = _refusals(old, new, new_tree, record, use_critic, ckpt)
    if issues:
        raise ConfigError(issues)
    refused_prefixes = tuple(f"{role}.model.override_config" for role in ("actor_rollout_ref", "critic"))
    lines = []
    for key in sorted(new):
        if key in NOT_COMPARED or key.startswith(refused_prefixes) or old.get(key, "<absent>") == new.get(key, "<absent>"):
            continue
        if key.startswith("critic.") and not use_critic:
            continue  # no critic is built: its (interpolated) keys do nothing
        lines.append(f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}: {_verdict(key, new)}")
    return lines
