"""verl 0.9.1 keys that megarl accepts but does not implement, and why.

Every key of verl's `ppo_megatron_trainer.yaml` is in megarl's yaml with verl's default, so a
verl command line or YAML composes unchanged. The keys megarl implements are typed in
`megarl/config/schema/`; each other key matches exactly one rule here:

- `refuse`: at its yaml default the key is harmless; any other value is refused before start-up,
  naming the key and the reason (megarl would otherwise silently ignore what the user asked for).
- `ignore`: a pure speed / resource switch with no counterpart in megarl (its work is done
  another way); any value is accepted and a changed value is logged once as having no effect.

Patterns are `fnmatch` globs over dotted keys (`*` also crosses dots); the first match wins.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from typing import Literal

Kind = Literal["refuse", "ignore"]

_RM_LEGACY = "verl 0.9.1 does not carry it over to reward.reward_model (its reward model is loaded from reward.reward_model.model_path alone)"
_RM_VLLM = ("vLLM engine setting of verl's reward-model server; megarl scores with a Megatron-Core forward "
            "(reward.reward_model: layout rollout.tensor/pipeline_model_parallel_size, batch rollout.max_num_seqs)")
_RM_SAMPLING = "sampling setting: a discriminative reward model scores sequences, it samples nothing (verl's /classify ignores it too)"
_MULTI_TURN = "not implemented in megarl's agent loop (megarl.agent)"
_LORA_FSDP = ("verl's Megatron engine reads LoRA from model.lora.* (these are its FSDP keys): set "
              "actor_rollout_ref.model.lora.rank / alpha / target_modules (Megatron names: linear_qkv, linear_proj, "
              "linear_fc1, linear_fc2) / exclude_modules")
_LORA_PART = "not implemented in megarl's LoRA (megarl/models/lora.py)"
_PROFILER = "megarl has no profiler integration; run under nsys / torch.profiler yourself"
_MM = "multimodal data is not supported by megarl"
_PACKING = "megarl pads or packs (model.use_remove_padding) its own way"
_KERNELS = "megarl runs Megatron-Core's own kernels (vocab-parallel log-probs never gather the vocabulary)"
_ONE_IMPL = "megarl has one trainer/worker implementation"
_LOADER = "megarl tokenizes the dataset once in the driver"
_MBRIDGE = "megarl always converts HF <-> Megatron one way (megarl/models/converters; per tensor the names mbridge maps, checked in tests/models/test_mbridge_names.py): verl's choice of bridge (mbridge or Megatron-Bridge) selects an implementation, not a result"
_ROLLOUT_PAR = "megarl's vLLM replicas are tensor- (and expert-) parallel only"
_TEACHER_VLLM = ("vLLM engine setting of verl's teacher server; megarl computes the teacher's log-probs with a "
                 "Megatron-Core forward (distillation.teacher_models.teacher_model.inference: tensor_model_parallel_size, "
                 "dtype, max_num_seqs, free_cache_engine)")
_DEPRECATED_MB = "deprecated global micro-batch size; set the *_per_gpu key instead (per rank)"


@dataclass(frozen=True)
class CompatRule:
    pattern: str
    kind: Kind
    reason: str
    accepted: tuple = ()  # refuse: values accepted besides the yaml default


    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


def _rules(kind: Kind, reason: str, *patterns: str) -> list[CompatRule]:
    return [CompatRule(p, kind, reason) for p in patterns]


RULES: tuple[CompatRule, ...] = tuple(
    # ---- speed / resource switches: accepted, no effect
    _rules("ignore", _KERNELS,
           "*.use_torch_compile", "*.use_fused_kernels", "*.fused_kernel_options.*", "*.use_liger",
           "*.entropy_from_logits_with_chunking", "*.entropy_from_logits_chunk_size")
    + _rules("ignore", _PACKING,
             "*.megatron.pad_bshd_to_minibatch_max", "*.megatron.pad_to_length", "*.megatron.pad_to_length_bucket")
    + _rules("ignore", _LOADER,
             "*.use_shm", "data.dataloader_num_workers", "data.filter_overlong_prompts_workers")
    + _rules("ignore", _MM,
             "data.image_key", "data.video_key", "data.audio_key", "data.image_patch_size",
             "data.return_multi_modal_inputs", "data.mm_processor_kwargs")
    + _rules("ignore", _MBRIDGE, "*.megatron.use_mbridge", "*.megatron.vanilla_mbridge")
    + _rules("ignore", "as in verl's Megatron backend, activation recompute is megatron.override_transformer_config."
             "recompute_granularity / recompute_method / recompute_num_layers", "*.model.enable_gradient_checkpointing")
    + _rules("ignore", "vLLM engine switch with no effect on what megarl computes",
             "actor_rollout_ref.rollout.disable_log_stats", "actor_rollout_ref.rollout.layered_summon",
             "actor_rollout_ref.rollout.multi_stage_wake_up", "actor_rollout_ref.rollout.skip_tokenizer_init",
             "actor_rollout_ref.rollout.scheduling_policy", "actor_rollout_ref.rollout.moe_load_balance_metrics_interval",
             "actor_rollout_ref.rollout.qat",
             "actor_rollout_ref.rollout.engine_kwargs.sglang",
             "actor_rollout_ref.rollout.engine_kwargs.trtllm")
    + _rules("ignore", "megarl runs each replica's samples as coroutines of one event loop in the rollout worker "
             "(no agent-loop worker processes to count)", "actor_rollout_ref.rollout.agent.num_workers")
    + _rules("ignore", "the reference model has no optimizer",
             "actor_rollout_ref.ref.megatron.use_distributed_optimizer", "actor_rollout_ref.ref.megatron.optimizer_offload",
             "actor_rollout_ref.ref.megatron.forward_only", "actor_rollout_ref.ref.rollout_n")
    + _rules("ignore", _ONE_IMPL,
             "trainer.esi_redundant_time", "trainer.ray_wait_register_center_timeout",
             "sandbox_fusion.max_concurrent", "sandbox_fusion.memory_limit_mb",
             "reward.sandbox_fusion.max_concurrent", "reward.sandbox_fusion.memory_limit_mb")
    # ---- accepted at verl's default only
    + _rules("refuse", _DEPRECATED_MB,
             "*.ppo_micro_batch_size", "*.log_prob_micro_batch_size")
    + _rules("refuse", _PROFILER, "*.profiler.*", "global_profiler.*")
    + _rules("refuse", _LORA_FSDP,
             "*.model.lora_rank", "*.model.lora_alpha", "*.model.target_modules", "*.model.exclude_modules")
    + _rules("refuse", "loading a pre-trained LoRA adapter is " + _LORA_PART + "; resume from a megarl checkpoint "
             "(trainer.resume_mode) to continue training adapters",
             "*.model.lora_adapter_path", "actor_rollout_ref.model.lora.adapter_path")
    + _rules("refuse", "LoRA dropout is " + _LORA_PART, "actor_rollout_ref.model.lora.dropout",
             "actor_rollout_ref.model.lora.dropout_position")
    + _rules("refuse", "LoRA adapters take the model's dtype (megatron.dtype) in megarl",
             "actor_rollout_ref.model.lora.dtype")
    + _rules("refuse", "training the base weights along with the adapters is " + _LORA_PART,
             "actor_rollout_ref.model.lora.freeze_language_model")
    + _rules("ignore", "megarl always syncs merged weights (W + alpha/rank * B @ A) into vLLM: the rollout "
             "computes the same function as with vLLM LoRA adapters (verl's merge=false)",
             "actor_rollout_ref.model.lora.merge")
    + _rules("ignore", _MM, "actor_rollout_ref.model.lora.freeze_vision_model",
             "actor_rollout_ref.model.lora.freeze_vision_projection")
    + _rules("ignore", "megarl's expert adapters run inside each expert on the tokens already dispatched to it, so no "
             "all-to-all of their own carries adapter inputs", "actor_rollout_ref.model.lora.a2a_experimental")
    + _rules("refuse", "LoRA on the critic is not implemented in megarl (the actor's is: actor_rollout_ref.model.lora.*)",
             "critic.model.lora.*")
    + _rules("refuse", _MULTI_TURN,
             "actor_rollout_ref.rollout.multi_turn.function_tool_path", "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts",
             "actor_rollout_ref.rollout.agent.custom_async_server.*", "actor_rollout_ref.rollout.trace.*",
             "actor_rollout_ref.rollout.router_config_path")
    + _rules("refuse", "megarl's tool agent appends the model's own tokens and the chat template's rendering of each tool "
             "turn (it never re-tokenizes the conversation, so there is nothing to sanity-check or re-template)",
             "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
             "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode")
    + _rules("refuse", "the driver renders prompts without tool schemas: describe the tools in the prompt "
             "(rollout.multi_turn.tool_config_path gives the tools to the agent loop)",
             "data.tool_config_path", "data.function_tool_path")
    # ---- learned reward model (reward.reward_model; megarl.workers.reward_model)
    + [CompatRule("reward.reward_model.rollout.name", "refuse",
                  "megarl scores a discriminative reward model the way verl's vLLM /classify does (the score head's "
                  "output at the last token) on Megatron-Core; sglang / trtllm have no counterpart", accepted=("vllm",))]
    + _rules("ignore", _RM_VLLM,
             "reward.reward_model.rollout.gpu_memory_utilization", "reward.reward_model.rollout.enforce_eager",
             "reward.reward_model.rollout.cudagraph_capture_sizes", "reward.reward_model.rollout.max_num_batched_tokens",
             "reward.reward_model.rollout.load_format", "reward.reward_model.rollout.layered_summon",
             "reward.reward_model.rollout.scheduling_policy", "reward.reward_model.rollout.multi_stage_wake_up",
             "reward.reward_model.rollout.engine_kwargs", "reward.reward_model.rollout.enable_chunked_prefill",
             "reward.reward_model.rollout.enable_prefix_caching", "reward.reward_model.rollout.disable_log_stats",
             "reward.reward_model.rollout.seed")
    + _rules("ignore", _RM_SAMPLING,
             "reward.reward_model.rollout.ignore_eos", "reward.reward_model.rollout.temperature",
             "reward.reward_model.rollout.top_k", "reward.reward_model.rollout.top_p",
             "reward.reward_model.rollout.do_sample", "reward.reward_model.rollout.n")
    + _rules("ignore", "verl reads them only with enable_resource_pool=true, which megarl refuses",
             "reward.reward_model.n_gpus_per_node", "reward.reward_model.nnodes")
    + _rules("refuse", "megarl colocates the reward model with the actor on trainer.nnodes x trainer.n_gpus_per_node "
             "(its own Megatron layout, its weights offloaded between calls with rollout.free_cache_engine)",
             "reward.reward_model.enable_resource_pool")
    + _rules("refuse", "megarl's reward-model replicas are its data-parallel groups: "
             "trainer world / (rollout.tensor_model_parallel_size x rollout.pipeline_model_parallel_size)",
             "reward.reward_model.rollout.data_parallel_size", "reward.reward_model.rollout.expert_parallel_size")
    + _rules("refuse", "not implemented in megarl's reward model",
             "reward.reward_model.rollout.full_determinism", "reward.reward_model.rollout.limit_images",
             "reward.reward_model.rollout.quantization", "reward.reward_model.rollout.quantization_config_file",
             "reward.reward_model.rollout.mtp", "reward.reward_model.rollout.disaggregation.*")
    + _rules("refuse", "the reward model's tokenizer renders its input (verl asserts the same)",
             "reward.reward_model.rollout.skip_tokenizer_init")
    + _rules("refuse", "legacy location of a reward.reward_model key: moved there at load (megarl.config.verl_compat.legacy, verl's migration)",
             "reward_model.enable_resource_pool", "reward_model.n_gpus_per_node", "reward_model.nnodes",
             "reward_model.model.path", "reward_model.rollout.*")
    + _rules("refuse", "legacy location of reward.num_workers: moved there at load", "reward_model.num_workers")
    + _rules("refuse", _RM_LEGACY,
             "reward_model.model.*")  # external_lib, trust_remote_code (model.path is moved, above)
    + _rules("refuse", "verl's legacy reward-model prompt ids; megarl renders the reward model's input from raw_prompt "
             "(data.return_raw_chat) with the reward model's chat template",
             "data.return_raw_input_ids")
    + _rules("refuse", "legacy location of reward.reward_manager.source / module (refused there)",
             "reward_model.reward_loop_source", "reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name")
    + _rules("refuse", "megarl's reward managers are built in (naive | batch | prime | dapo); use reward.custom_reward_function for custom scoring",
             "reward.reward_manager.source", "reward.reward_manager.module.*")
    + _rules("refuse", "sandboxed code execution is not implemented in megarl", "sandbox_fusion.*", "reward.sandbox_fusion.*")
    + _rules("refuse", _ROLLOUT_PAR,
             "actor_rollout_ref.rollout.pipeline_model_parallel_size",
             "actor_rollout_ref.rollout.disaggregation.*")
    + [CompatRule("actor_rollout_ref.rollout.checkpoint_engine.backend", "refuse",
                  "megarl's weight sync is its own bucketed resharding (size: rollout.weight_sync.bucket_size_mb); nccl "
                  "(what verl's trainer.v1.trainer_mode=separate_async requires) is megarl's broadcast to the standalone "
                  "engines over a process group (NCCL on GPU, gloo with trainer.device=cpu)", accepted=("nccl",))]
    + _rules("refuse", "megarl's weight sync is its own bucketed resharding (size: rollout.weight_sync.bucket_size_mb)",
             "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
             "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module")
    + _rules("refuse", "not implemented in megarl's vLLM rollout",
             "actor_rollout_ref.rollout.full_determinism", "actor_rollout_ref.rollout.logprobs_mode",
             "actor_rollout_ref.rollout.over_sample_rate",
             "actor_rollout_ref.rollout.prometheus.*", "actor_rollout_ref.rollout.quantization",
             "actor_rollout_ref.rollout.quantization_config_file", "actor_rollout_ref.rollout.mtp",
             "actor_rollout_ref.rollout.cudagraph_capture_sizes")
    + _rules("refuse", "multi-token prediction is not implemented in megarl", "*.model.mtp.*")
    + _rules("refuse", "not implemented in megarl's model loading",
             "*.model.hf_config_path", "*.model.external_lib", "*.model.enable_activation_offload",
             "*.model.tiled_mlp.*")
    + _rules("refuse", "the critic scores the prompts the actor's chat template rendered; set actor_rollout_ref.model.custom_chat_template",
             "critic.model.custom_chat_template")
    + _rules("refuse", "quantization-aware training is not implemented in megarl", "*.qat.*")
    + _rules("refuse", "the critic replays no routes (verl's neither): its own routers choose",
             "critic.megatron.router_replay.*")
    + _rules("refuse", "megarl's routes travel in the batch (routed_experts), never through files",
             "*.megatron.router_replay.record_file", "*.megatron.router_replay.replay_file")
    + _rules("refuse", "dynamic context parallelism (DPxCP groups sized per batch) is not implemented in megarl; "
             "static megatron.context_parallel_size is",
             "*.megatron.dynamic_context_parallel", "*.megatron.max_seqlen_per_dp_cp_rank")
    + _rules("ignore", "the reference model has no gradients", "actor_rollout_ref.ref.megatron.grad_offload")
    + _rules("ignore", "the reference model is forward-only: verl 0.9.1 wraps only trained models in DDP or "
             "Megatron-FSDP", "actor_rollout_ref.ref.megatron.use_megatron_fsdp")
    + _rules("ignore", "the reference model has no optimizer state to checkpoint",
             "actor_rollout_ref.ref.megatron.dist_ckpt_optim_fully_reshardable",
             "actor_rollout_ref.ref.megatron.distrib_optim_fully_reshardable_mem_efficient")
    + _rules("refuse", "not implemented in megarl's Megatron engine",
             "*.megatron.dist_checkpointing_prefix", "*.megatron.override_ddp_config",
             "*.megatron.override_mcore_model_config", "*.megatron.forward_only",
             "*.optim.use_layer_wise_distributed_optimizer", "*.optim.muon_*")
    + _rules("refuse", "not implemented in megarl's checkpoints",
             "*.checkpoint.async_save", "*.checkpoint.strict", "*.checkpoint.mbridge_config",
             "trainer.checkpoint_callback_class", "trainer.del_local_ckpt_after_load", "trainer.default_hdfs_dir")
    + _rules("refuse", "not implemented in megarl's actor",
             "actor_rollout_ref.actor.freeze_vision_tower", "actor_rollout_ref.actor.use_prefix_grouper",
             "actor_rollout_ref.actor.calculate_entropy")
    + _rules("refuse", "not implemented in megarl's data loader",
             "data.gen_batch_size")
    + _rules("refuse", "verl's sync mode has no options", "trainer.v1.sync*")
    + _rules("refuse", "lending the trainer's GPUs to generation between steps (verl's hybrid switch) is not implemented: "
             "megarl's separate_async has no rollout replicas on the trainer's GPUs", "trainer.v1.separate_async.hybrid_rollout.enable_switch")
    + _rules("ignore", "verl reads it only with trainer.v1.separate_async.hybrid_rollout.enable_switch=true, which megarl refuses",
             "trainer.v1.separate_async.hybrid_rollout.*")
    + _rules("refuse", "megarl's sampler is built in (admission control and batch selection, megarl.trainer.v1); "
             "a custom ReplayBuffer class has no counterpart", "trainer.v1.sampler.custom_sampler.*", "trainer.v1.sampler.sampler_kwargs*")
    + _rules("refuse", "megarl's rollout has no failed groups to refill: a sample whose agent loop raises stops the step "
             "with its error", "trainer.v1.sampler.sync_refill_failed_groups")
    + _rules("refuse", "not implemented in megarl's trainer",
             "algorithm.use_pf_ppo", "algorithm.pf_ppo.*",
             "algorithm.filter_groups.max_inflight_gen_batches")
    + _rules("ignore", "megarl runs one teacher (verl routes rows among several by teacher_key; its single "
             "teacher is keyed 'default' with pool / TP-size replicas, as megarl's)",
             "distillation.teacher_key", "distillation.teacher_models.teacher_model.key", "distillation.teacher_models.teacher_model.num_replicas")
    + _rules("ignore", _TEACHER_VLLM,
             "distillation.teacher_models.teacher_model.inference.name", "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization", "distillation.teacher_models.teacher_model.inference.enforce_eager",
             "distillation.teacher_models.teacher_model.inference.cudagraph_capture_sizes", "distillation.teacher_models.teacher_model.inference.max_num_batched_tokens",
             "distillation.teacher_models.teacher_model.inference.load_format", "distillation.teacher_models.teacher_model.inference.engine_kwargs", "distillation.teacher_models.teacher_model.inference.enable_chunked_prefill",
             "distillation.teacher_models.teacher_model.inference.enable_prefix_caching", "distillation.teacher_models.teacher_model.inference.disable_log_stats",
             "distillation.teacher_models.teacher_model.inference.skip_tokenizer_init")
    + _rules("refuse", "the teacher's Megatron-Core forward is tensor parallel (inference.tensor_model_parallel_size) "
             "and data parallel over the rest of its pool", "distillation.teacher_models.teacher_model.inference.data_parallel_size",
             "distillation.teacher_models.teacher_model.inference.expert_parallel_size")
    + _rules("refuse", _MM, "distillation.teacher_models.teacher_model.inference.limit_images")
    + _rules("refuse", "verl's transfer queue has no counterpart in megarl (the controller moves DataProto through Ray)",
             "transfer_queue.*")
    + _rules("refuse", "verl's rollout skip/dump manager has no counterpart in megarl (use trainer.rollout_data_dir)",
             "skip.*")
)


@functools.cache  # RULES is fixed; every validation asks for the same few thousand keys (0.3 ms each uncached)
def rule_for(key: str) -> CompatRule | None:
    """The rule covering dotted `key` (a leaf, or a section any rule reaches into)."""
    for rule in RULES:
        if rule.matches(key) or rule.matches(key + ".x"):
            return rule
    return None
