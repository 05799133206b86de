"""Rank bodies for tests/workers/test_lora.py (spawned by dist_utils.run_distributed)."""

from __future__ import annotations

import torch

from helpers.tiny import actor_rollout_ref_config, dp_rows, megatron_node, worker_data
from worker_bodies import _allow_checkpoint_writer_processes, _export, _rank0

RANK, ALPHA = 4, 8.0  # scale alpha / rank = 2
# layer 0's adapted linears, for the hand-computed merge (TP = 1)
LAYER0 = ("self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


def lora_config(model_path: str, megatron: dict, rank: int = RANK):
    cfg = actor_rollout_ref_config(model_path, megatron)
    cfg.model.lora.rank = rank
    cfg.model.lora.alpha = ALPHA
    cfg.actor.checkpoint.save_contents = ["model", "optimizer", "extra", "hf_model"]  # + the merged HF export
    return cfg


def _params(actor) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for chunk in actor.engine.unwrapped_chunks() for n, p in chunk.named_parameters()}


def key_effects(model_path: str) -> dict:
    """Which linears each model.lora setting adapts, A's init per method, and the errors of bad
    targets (one process, TP = 1)."""
    import transformers

    from megarl.models import build_model, load_hf_weights
    from megarl.models.lora import LoraSpec, adapters, apply_lora

    hf = transformers.AutoConfig.from_pretrained(model_path)
    megatron = lora_config(model_path, megatron_node()).actor.megatron  # the actor's build settings
    build_cfg = {"sequence_parallel": False,
                 "override_transformer_config": dict(megatron.override_transformer_config)}
    defaults = {"rank": RANK, "alpha": ALPHA, "target_modules": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"),
                "exclude_modules": (), "a_init": "xavier", "seed": 42}

    def adapt(**change):
        chunks = build_model(hf, build_cfg, device="cpu")
        load_hf_weights(chunks, model_path)
        try:
            names = apply_lora(chunks[0], LoraSpec(**{**defaults, **change}))
        except ValueError as error:
            return str(error)
        return {"names": names, "A": {n: a.A.detach().clone() for n, (_, a) in zip(names, adapters(chunks))}}

    return {
        "default": adapt(), "qkv_only": adapt(target_modules=("linear_qkv",)),
        "pattern": adapt(target_modules=("*.layers.1.*",)), "exclude": adapt(exclude_modules=("decoder.layers.0.*", "linear_fc2")),
        "kaiming": adapt(a_init="kaiming"), "normal": adapt(a_init="normal"), "typo": adapt(target_modules=("linear_qkvv",)),
        "nothing": adapt(exclude_modules=("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")),
    }


def lora_actor_suite(model_path: str, batch: dict, layouts: dict[str, dict], ckpt_dir: str | None = None,
                     load_dir: str | None = None) -> dict:
    """Per layout (one world, e.g. TP=2 without and with sequence parallelism): a LoRA actor's
    log-probs, reference (adapters off) log-probs, one PPO step (which parameters changed), the
    same after it, and the merged HF export. `ckpt_dir`: the last layout saves its adapters there.
    `load_dir` (after that save): a fresh actor loads those adapters, one with another rank must
    refuse them. In a world of one process `key_effects` runs too."""
    from megarl.workers.actor import ActorWorker

    out: dict = {}
    for name, megatron in layouts.items():
        actor = ActorWorker(lora_config(model_path, megatron), "actor", device="cpu")
        actor.init_model()
        data = worker_data(batch, dp_rows(batch))
        before = _params(actor)
        res = {"trainable": sorted(n for c in actor.engine.unwrapped_chunks() for n, p in c.named_parameters()
                                   if p.requires_grad)}
        res["lp0"] = actor.compute_log_prob(data).batch["old_log_probs"]
        res["ref0"] = actor.compute_ref_log_prob(data).batch["ref_log_prob"]
        res["metrics"] = actor.update_policy(data)
        after = _params(actor)
        res["changed"] = sorted(n for n in before if not torch.equal(before[n], after[n]))
        res["lp1"] = actor.compute_log_prob(data).batch["old_log_probs"]
        res["ref1"] = actor.compute_ref_log_prob(data).batch["ref_log_prob"]
        res["merged"] = _rank0(_export(actor))
        res["base_unchanged_by_export"] = all(torch.equal(after[n], p) for n, p in _params(actor).items())
        if torch.distributed.get_world_size() == 1:
            model = actor.engine.unwrapped_chunks()[0]
            layer = model.decoder.layers[0]
            res["layer0"] = {path: {k: getattr(layer.get_submodule(path).lora, k).detach().clone() for k in ("A", "B")}
                             for path in LAYER0}
        out[name] = res
    if ckpt_dir is not None:
        _allow_checkpoint_writer_processes()
        actor.save_checkpoint(ckpt_dir)
    if torch.distributed.get_world_size() == 1:
        out["key_effects"] = key_effects(model_path)
    if load_dir is not None:
        _allow_checkpoint_writer_processes()
        fresh = ActorWorker(lora_config(model_path, next(iter(layouts.values()))), "actor", device="cpu")
        fresh.init_model()
        fresh.load_checkpoint(load_dir)
        out["loaded_lp"] = fresh.compute_log_prob(worker_data(batch, dp_rows(batch))).batch["old_log_probs"]
        other = ActorWorker(lora_config(model_path, next(iter(layouts.values())), rank=2 * RANK), "actor", device="cpu")
        other.init_model()
        try:
            other.load_checkpoint(load_dir)
            out["other_rank_error"] = None
        except ValueError as error:
            out["other_rank_error"] = str(error)
    return out


def lora_hybrid_sync(hf_dir: str, prompt_rows: list[list[int]], temperature: float) -> dict:
    """ActorRolloutRefWorker with LoRA (one rank, vLLM TP=1): give the adapters a nonzero B,
    generate (syncs merged weights into vLLM), score with the actor (adapters on) and the
    reference (adapters off); the o_proj / down_proj of layer 0 streamed into vLLM and the
    adapters behind them."""
    from helpers.tiny_hf import actor_rollout_ref_config as hf_config_node
    from helpers.tiny_hf import left_padded_prompts

    from megarl.models.lora import adapters
    from megarl.workers.hybrid import ActorRolloutRefWorker

    P = 8
    cfg = hf_config_node(hf_dir, P, 6, **{"model.lora.rank": RANK, "model.lora.alpha": ALPHA, "rollout.n": 2,
                                            "rollout.temperature": temperature, "rollout.ignore_eos": True,
                                            "rollout.weight_sync.integrity_check": True})
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref", device="cpu")
    worker.init_model()
    chunks = worker.actor.engine.chunks
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # what training does to B (it starts at zero)
        for _, adapter in adapters(chunks):
            adapter.B.copy_(torch.randn(adapter.B.shape, generator=gen) * 0.05)
    worker.weight_sync.mark_changed()  # what update_actor does after an optimizer step
    base = {n: p.detach().clone() for n, p in worker.actor.engine.unwrapped_chunks()[0].named_parameters()
            if ".lora." not in n}

    prompts = left_padded_prompts(prompt_rows, P)
    # What vLLM's reload_weights receives (its CPU kernels repack the parameters: not readable after)
    streamed: dict[str, torch.Tensor] = {}
    update_weights = worker.rollout.update_weights

    def tee(named_tensors):
        def stream():
            for name, tensor in named_tensors:
                streamed[name] = tensor.detach().clone()
                yield name, tensor
        return update_weights(stream())

    worker.rollout.update_weights = tee
    sampled = worker.generate_sequences(prompts, validate=False, do_sample=True)
    scored = worker.compute_log_prob(sampled)
    ref = worker.compute_ref_log_prob(sampled)
    layer = worker.actor.engine.unwrapped_chunks()[0].decoder.layers[0]
    out = {
        "has_ref_model": worker.ref is not None,
        "sampled": {k: v.clone() for k, v in sampled.batch.items()},
        "old_log_probs": scored.batch["old_log_probs"].clone(),
        "ref_log_prob": ref.batch["ref_log_prob"].clone(),
        "streamed": {k: streamed[f"model.layers.0.{k}"] for k in ("self_attn.o_proj.weight", "mlp.down_proj.weight")},
        "adapters": {path: {k: getattr(layer.get_submodule(path).lora, k).detach().clone() for k in ("A", "B")}
                     for path in ("self_attention.linear_proj", "mlp.linear_fc2")},
        "base_unchanged": all(torch.equal(base[n], p) for n, p in worker.actor.engine.unwrapped_chunks()[0].named_parameters()
                              if ".lora." not in n),
        "sync": dict(sampled.meta_info["metrics"]),
    }
    worker.shutdown()
    return out


# LoRA on an MoE model (tests/workers/test_lora_moe.py): dense and expert MLPs, attention output
MOE_TARGETS = ["linear_proj", "linear_fc1", "linear_fc2"]


def _moe_actor(model_path: str, megatron: dict):
    from megarl.workers.actor import ActorWorker

    cfg = lora_config(model_path, megatron)
    cfg.model.lora.target_modules = MOE_TARGETS
    actor = ActorWorker(cfg, "actor", device="cpu")
    actor.init_model()
    return actor


def lora_moe_suite(model_path: str, batch: dict, megatron: dict, ckpt_dir: str | None = None) -> dict:
    """A LoRA actor on a tiny MoE model, every adapter's B set to a value drawn from its global name
    (the same on every expert-parallel layout): each adapter's (A, B) on this rank, log-probs, the
    merged export (rank 0), one PPO step (trainable and changed parameters, grad norm), and the same
    after it; then its checkpoint saved to `ckpt_dir` if given."""
    from megarl.models.lora import adapters

    actor = _moe_actor(model_path, megatron)
    pairs = [adapter for _, adapter in adapters(actor.engine.chunks)]
    with torch.no_grad():
        for adapter in pairs:
            seed = int.from_bytes(adapter.name.encode(), "little") % 2**31
            adapter.B.copy_(torch.randn(adapter.B.shape, generator=torch.Generator().manual_seed(seed)) * 0.1)

    def state() -> dict:
        return {a.name: {"A": a.A.detach().clone(), "B": a.B.detach().clone()} for a in pairs}

    data = worker_data(batch, dp_rows(batch))
    res = {"adapters0": state(), "lp0": actor.compute_log_prob(data).batch["old_log_probs"],
           "merged0": _rank0(_export(actor)),
           "trainable": sorted(n for c in actor.engine.unwrapped_chunks() for n, p in c.named_parameters() if p.requires_grad)}
    before = _params(actor)
    res["metrics"] = actor.update_policy(data)
    after = _params(actor)
    res["changed"] = sorted(n for n in before if not torch.equal(before[n], after[n]))
    res.update(adapters1=state(), lp1=actor.compute_log_prob(data).batch["old_log_probs"], merged1=_rank0(_export(actor)))
    res["base_unchanged_by_export"] = all(torch.equal(after[n], p) for n, p in _params(actor).items())
    if ckpt_dir is not None:
        _allow_checkpoint_writer_processes()
        actor.save_checkpoint(ckpt_dir)
    return res


def lora_moe_loaded_log_probs(model_path: str, batch: dict, megatron: dict, load_dir: str) -> torch.Tensor:
    """A fresh LoRA actor on the tiny MoE model with the adapters of `load_dir`: its log-probs."""
    _allow_checkpoint_writer_processes()
    actor = _moe_actor(model_path, megatron)
    actor.load_checkpoint(load_dir)
    return actor.compute_log_prob(worker_data(batch, dp_rows(batch))).batch["old_log_probs"]
