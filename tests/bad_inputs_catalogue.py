"""The bad-input catalogue: broken configs, model dirs and datasets a user can hand
`python -m megarl.main_ppo`, each with the words its error must contain (the key or
file/row, and the fix). `tests/test_bad_inputs.py` runs them; the README's common-errors
section is rendered from the cases marked `readme`.

A case is command-line overrides (Hydra syntax; `{dir}` = a fresh directory of the case,
`{demo}` = the demo assets dir) plus an optional `setup(dir, demo)` that writes the broken
files first.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from megarl.data.demo import TRAIN_ROWS

Setup = Callable[[Path, Path], None]
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
M = "actor_rollout_ref.actor.megatron"
MODEL = "actor_rollout_ref.model.path"
SOURCE = "megarl/arithmetic"  # the demo data source (a built-in scorer)
# The batch and length values the cases' expected words assume, pinned so that tuning the
# yaml's demo defaults does not change the catalogue (a case's own override wins).
BASE_ARGS = (
    "data.train_batch_size=16", f"{R}.n=8", f"{A}.ppo_mini_batch_size=8", f"{A}.ppo_micro_batch_size_per_gpu=16",
    "data.max_prompt_length=32", "data.max_response_length=8",
)
# With a model path the demo profile is off and verl's defaults apply: what a user adds to run
# the demo's data on one CPU slot (so such a case fails on its own key, not on these).
REAL_RUN_ARGS = (
    "data.train_files={demo}/train.parquet", "data.val_files={demo}/val.parquet", "trainer.device=cpu",
    "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=grpo", f"{R}.log_prob_micro_batch_size_per_gpu=16",
    f"{R}.tensor_model_parallel_size=1",
)


@dataclass(frozen=True)
class Case:
    """id; args: overrides; key: the config key the error must name; words: substrings
    of that key's issue (problem and fix); setup: writes files; subprocess: also run through
    a real `python -m megarl.main_ppo`; readme: a row of the README common-errors table."""

    id: str
    args: tuple[str, ...]
    key: str
    words: tuple[str, ...]
    setup: Setup | None = None
    subprocess: bool = False
    readme: bool = False
    tags: tuple[str, ...] = field(default=())


# ----------------------------------------------------------------------------- setups
def row(i: int, content: str = "1 + 2 =", source: str | None = SOURCE, prompt=None) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}] if prompt is None else prompt,
        "reward_model": {"style": "rule", "ground_truth": "3"},
        "extra_info": {"index": i},
    }


def rows_file(name: str, make_rows: Callable[[], list[dict]]) -> Setup:
    def setup(d: Path, demo: Path) -> None:
        pq.write_table(pa.Table.from_pylist(make_rows()), str(d / name))

    return setup


def bytes_file(name: str, data: bytes) -> Setup:
    def setup(d: Path, demo: Path) -> None:
        (d / name).write_bytes(data)

    return setup


def empty_parquet(d: Path, demo: Path) -> None:
    pq.write_table(pq.read_table(str(demo / "train.parquet")).slice(0, 0), str(d / "train.parquet"))


def model_copy(changes: dict | None = None, drop: tuple[str, ...] = (), files: tuple[str, ...] | None = None) -> Setup:
    """The demo model dir copied to {dir}/model with config.json fields changed / dropped;
    `files`: keep only these files."""

    def setup(d: Path, demo: Path) -> None:
        shutil.copytree(demo / "model", d / "model")
        if files is not None:
            for p in (d / "model").iterdir():
                if p.name not in files:
                    p.unlink()
        config = json.loads((d / "model" / "config.json").read_text())
        config.update(changes or {})
        for name in drop:
            config.pop(name, None)
        (d / "model" / "config.json").write_text(json.dumps(config))

    return setup


def text_file(name: str, text: str) -> Setup:
    def setup(d: Path, demo: Path) -> None:
        (d / name).write_text(text)

    return setup


def empty_dir(name: str) -> Setup:
    def setup(d: Path, demo: Path) -> None:
        (d / name).mkdir()

    return setup


def corrupt_config_json(d: Path, demo: Path) -> None:
    shutil.copytree(demo / "model", d / "model")
    (d / "model" / "config.json").write_text("{not json")


LONG = " + ".join(["7"] * 28) + " ="  # 83 tokens + 2 role markers = 85 with the demo tokenizer
TWENTY_ROWS_ONE_LONG = rows_file("train.parquet", lambda: [row(i, LONG if i == 7 else "1 + 2 =") for i in range(20)])
PLUGINS = """
from torch.utils.data import Sampler

class NotASampler:
    pass

class NotADataset:
    pass

def other_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
"""
MOE = {"model_type": "qwen3_moe", "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 64}

# ----------------------------------------------------------------------------- cases
CASES: tuple[Case, ...] = (
    # types, unknown keys, syntax
    Case("type_int_got_string", ("data.train_batch_size=abc",), "data.train_batch_size",
         ("expected integer, got str", "e.g. data.train_batch_size=", "(the default)"), subprocess=True, readme=True),
    Case("type_bool_got_string", (f"{A}.use_kl_loss=maybe",), f"{A}.use_kl_loss", ("expected boolean", "e.g.")),
    Case("type_number_got_string", (f"{A}.optim.lr=fast",), f"{A}.optim.lr", ("expected number, got str",)),
    Case("type_list_for_int", (f"{R}.n=[4,8]",), f"{R}.n", ("expected integer, got list", f"{R}.n=1")),  # the yaml default (verl's)
    Case("type_null_for_int", ("data.max_prompt_length=null",), "data.max_prompt_length", ("expected integer, got null",)),
    Case("unknown_key_typo", (f"{R}.temprature=0.7",), f"{R}.temprature",
         ("unknown key", f"did you mean {R}.temperature"), readme=True),
    Case("unsupported_verl_key", (f"+{A}.fsdp_config.param_offload=true",), f"{A}.fsdp_config",
         ("FSDP is not supported", "megatron", f"remove {A}.fsdp_config")),
    Case("override_syntax", ("data.train_batch_size=[16,",), "data.train_batch_size",
         ("cannot parse the command-line override", "lists as key=[a,b]"), subprocess=True),
    Case("plus_on_existing_key", ("+data.train_batch_size=8",), "data.train_batch_size",
         ("is already in the config; '+' only adds new keys", "drop the '+': data.train_batch_size=8")),
    # out of range
    Case("lr_negative", (f"{A}.optim.lr=-1e-6",), f"{A}.optim.lr", ("must be > 0", "a value > 0")),
    Case("n_zero", (f"{R}.n=0",), f"{R}.n", ("must be >= 1",)),
    Case("top_p_above_one", (f"{R}.top_p=1.5",), f"{R}.top_p", ("must be <= 1",)),
    Case("gpu_memory_zero", (f"{R}.gpu_memory_utilization=0",), f"{R}.gpu_memory_utilization", ("must be > 0",)),
    Case("save_freq_zero", ("trainer.save_freq=0",), "trainer.save_freq", ("positive number of steps or -1", "trainer.save_freq=-1")),
    Case("betas_three_values", (f"{A}.optim.betas=[0.9,0.99,0.999]",), f"{A}.optim.betas", ("exactly two values", "[0.9,0.999]")),
    Case("rollout_is_threshold_reversed", ('algorithm.rollout_correction.rollout_is_threshold="2.0_0.5"',),
         "algorithm.rollout_correction.rollout_is_threshold", ("0 < lower <= upper", '"0.5_2.0"')),
    # unknown names
    Case("unknown_adv_estimator", ("algorithm.adv_estimator=ppo",), "algorithm.adv_estimator",
         ("unknown name 'ppo'", "use one of: gae, grpo"), readme=True),
    Case("unknown_loss_mode", (f"{A}.policy_loss.loss_mode=ppo_clip",), f"{A}.policy_loss.loss_mode",
         ("unknown name 'ppo_clip'", "vanilla", "bypass_mode"), readme=True),
    Case("unknown_loss_agg_mode", (f"{A}.loss_agg_mode=mean",), f"{A}.loss_agg_mode", ("unknown name 'mean'", "token-mean", "seq-mean-token-sum-norm")),
    Case("unknown_kl_loss_type", (f"{A}.kl_loss_type=kl3",), f"{A}.kl_loss_type", ("unknown name 'kl3'", "low_var_kl")),
    Case("rollout_engine_sglang", (f"{R}.name=sglang",), f"{R}.name", ("vLLM only", f"{R}.name=vllm")),
    Case("strategy_fsdp", (f"{A}.strategy=fsdp",), f"{A}.strategy", ("Megatron-Core only", f"{A}.strategy=megatron")),
    Case("unknown_reward_manager", ("reward.reward_manager.name=foo",), "reward.reward_manager.name", ("naive, batch, prime, dapo",)),
    Case("unknown_logger", ("trainer.logger=[console,clearml]",), "trainer.logger", ("unknown name 'clearml'", "mlflow")),
    Case("unknown_truncation", ("data.truncation=cut",), "data.truncation", ("unknown name 'cut'", "error, left, right, middle")),
    Case("unknown_rollout_rs", ("algorithm.rollout_correction.rollout_rs=token_k4",), "algorithm.rollout_correction.rollout_rs",
         ("unknown name 'token_k4'", "seq_max_k3")),
    # batch sizes
    Case("mini_batch_not_dividing", (f"{A}.ppo_mini_batch_size=5",), f"{A}.ppo_mini_batch_size",
         ("must divide data.train_batch_size=16", f"{A}.ppo_mini_batch_size=4"), readme=True),
    Case("mini_batch_above_train_batch", (f"{A}.ppo_mini_batch_size=32",), f"{A}.ppo_mini_batch_size",
         ("must divide data.train_batch_size=16", f"{A}.ppo_mini_batch_size=16")),
    Case("micro_batch_above_per_rank", (f"{A}.ppo_micro_batch_size_per_gpu=128",), f"{A}.ppo_micro_batch_size_per_gpu",
         ("larger than the per-rank mini-batch", "8 prompts x n=8 / dp=1 = 64", "<= 64"), readme=True),
    Case("micro_batch_not_dividing", (f"{A}.ppo_micro_batch_size_per_gpu=24",), f"{A}.ppo_micro_batch_size_per_gpu",
         ("must divide the per-rank mini-batch of 64", "=16")),
    Case("micro_batch_null", (f"{A}.ppo_micro_batch_size_per_gpu=null",), f"{A}.ppo_micro_batch_size_per_gpu",
         ("required when use_dynamic_bsz is false",)),
    Case("token_budget_too_small", (f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=16"), f"{A}.ppo_max_token_len_per_gpu",
         ("smaller than one full sequence", ">= 40")),
    Case("mini_batch_not_splitting_over_dp", ("trainer.n_gpus_per_node=2", f"{R}.n=3", f"{A}.ppo_mini_batch_size=1"),
         f"{A}.ppo_mini_batch_size", ("3 responses do not split evenly over 2 data-parallel ranks",)),
    Case("group_estimator_n_one", (f"{R}.n=1",), f"{R}.n", ("needs a group of >= 2", "algorithm.adv_estimator=gae"), readme=True),
    Case("log_prob_micro_batch_null", (f"{R}.log_prob_micro_batch_size_per_gpu=null",), f"{R}.log_prob_micro_batch_size_per_gpu",
         ("required when log_prob_use_dynamic_bsz is false",)),
    # parallel layouts against the model (demo: 4 heads, 2 KV heads, 2 layers, dense)
    Case("tp_not_dividing_heads", ("trainer.n_gpus_per_node=3", f"{M}.tensor_model_parallel_size=3"), f"{M}.tensor_model_parallel_size",
         ("does not divide num_attention_heads=4", "divides 4"), readme=True),
    Case("pp_above_layers", ("trainer.n_gpus_per_node=4", f"{M}.pipeline_model_parallel_size=4"), f"{M}.pipeline_model_parallel_size",
         ("does not divide num_hidden_layers=2",)),
    Case("ep_on_dense_model", ("trainer.n_gpus_per_node=2", f"{M}.expert_model_parallel_size=2"), f"{M}.expert_model_parallel_size",
         ("the model has no MoE experts", f"{M}.expert_model_parallel_size=1")),
    Case("ep_not_dividing_experts", ("trainer.n_gpus_per_node=4", f"{M}.expert_model_parallel_size=4", f"{MODEL}={{dir}}/model"),
         f"{M}.expert_model_parallel_size", ("does not divide the 6 experts",), setup=model_copy(MOE)),
    Case("world_size_not_divisible", (f"{M}.tensor_model_parallel_size=2",), f"{M}.tensor_model_parallel_size",
         ("does not divide the world size = trainer.nnodes x trainer.n_gpus_per_node = 1",), readme=True),
    Case("vllm_tp_not_dividing_world", (f"{R}.tensor_model_parallel_size=2",), f"{R}.tensor_model_parallel_size",
         ("vLLM TP must divide the world size",)),
    Case("context_parallel_above_world", ("trainer.n_gpus_per_node=2", f"{M}.context_parallel_size=4"), f"{M}.tensor_model_parallel_size",
         ("cp=4 = 4 does not divide", "context_parallel_size whose product divides 2")),
    Case("vpp_without_pp", (f"{M}.virtual_pipeline_model_parallel_size=2",), f"{M}.virtual_pipeline_model_parallel_size",
         ("needs pipeline_model_parallel_size > 1",)),
    Case("lengths_above_max_positions", ("data.max_response_length=200",), "data.max_response_length",
         ("exceeds the model's max_position_embeddings=128", "<= 128")),
    Case("unknown_transformer_config_field", (f"+{M}.override_transformer_config.recompute_granularty=selective",),
         f"{M}.override_transformer_config.recompute_granularty",
         ("not a Megatron TransformerConfig field", "did you mean recompute_granularity")),
    Case("unknown_optimizer_config_field", (f"+{A}.optim.override_optimizer_config.adam_epsilon=1e-6",),
         f"{A}.optim.override_optimizer_config.adam_epsilon",
         ("not a Megatron OptimizerConfig field", "did you mean adam_eps")),
    Case("optimizer_override_of_a_key", (f"+{A}.optim.override_optimizer_config.bf16=true",),
         f"{A}.optim.override_optimizer_config.bf16", (f"set actor_rollout_ref.actor.megatron.dtype",)),
    Case("precision_aware_optimizer_on_cpu", ("trainer.device=cpu", f"{A}.optim.use_precision_aware_optimizer=true"),
         f"{A}.optim.use_precision_aware_optimizer", ("precision-aware optimizer cannot run here", "trainer.device=cpu")),
    Case("cpu_optimizer_without_a_fraction", (f"+{A}.optim.override_optimizer_config.optimizer_cpu_offload=true",),
         f"{A}.optim.override_optimizer_config.optimizer_offload_fraction", ("must be in (0, 1]", "verl's scripts: 1")),
    Case("wsd_without_decay_steps", (f"{A}.optim.lr_decay_style=WSD",), f"{A}.optim.lr_wsd_decay_steps",
         ("needs the length of its final decay phase",)),
    Case("min_lr_above_lr", (f"{A}.optim.lr=1e-6", f"{A}.optim.min_lr=1e-5"), f"{A}.optim.min_lr", ("above the peak",)),
    Case("unknown_vllm_engine_arg", (f"+{R}.engine_kwargs.vllm.swap_space=4",), f"{R}.engine_kwargs.vllm.swap_space",
         ("not a vllm.LLM engine argument", f"remove {R}.engine_kwargs.vllm.swap_space")),
    # the local machine (no RAY_ADDRESS): slots that a one-node Ray cannot place
    Case("nnodes_without_cluster", ("trainer.nnodes=2",), "trainer.nnodes",
         ("a local Ray (RAY_ADDRESS is not set) has one node", "export RAY_ADDRESS")),
    Case("more_gpus_than_the_machine", ("trainer.device=cuda", "trainer.n_gpus_per_node=64", f"{A}.ppo_micro_batch_size_per_gpu=1"),
         "trainer.n_gpus_per_node", ("CUDA GPU(s) (trainer.device=cuda)", "set trainer.n_gpus_per_node <=")),
    Case("more_cpu_ranks_than_cpus", ("trainer.device=cpu", "ray_kwargs.ray_init.num_cpus=2", "trainer.n_gpus_per_node=8",
                                      f"{A}.ppo_micro_batch_size_per_gpu=8"),
         "trainer.n_gpus_per_node", ("8 CPU ranks reserve 4 CPUs (0.5 each) but ray_kwargs.ray_init.num_cpus has 2", "<= 4")),
    # trainer.v1 (verl's V1 trainer modes)
    Case("warmup_beyond_the_staleness_threshold",
         ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=1"),
         "trainer.v1.colocate_async.num_warmup_batches",
         ("beyond trainer.v1.sampler.max_off_policy_threshold=1", "set trainer.v1.colocate_async.num_warmup_batches <= 0"),
         readme=True),
    Case("separate_async_without_a_rollout_pool",
         ("trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false",
          f"{R}.checkpoint_engine.backend=nccl", "trainer.v1.separate_async.parameter_sync_step=2"),
         f"{R}.nnodes", ("standalone rollout pool", f"set {R}.nnodes >= 1")),
    Case("separate_async_engines_beyond_the_cpus",
         ("trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false", f"{R}.nnodes=1",
          f"{R}.n_gpus_per_node=4", f"{R}.checkpoint_engine.backend=nccl", "trainer.v1.separate_async.parameter_sync_step=2",
          "trainer.device=cpu", "ray_kwargs.ray_init.num_cpus=2"),
         f"{R}.n_gpus_per_node", ("5 CPU ranks reserve 2.5 CPUs", "the separate_async engines' 4", f"set {R}.n_gpus_per_node <= 3")),
    # model directory
    Case("model_dir_missing", (f"{MODEL}={{dir}}/nope",), MODEL,
         ("model directory does not exist", "huggingface-cli download"), subprocess=True, readme=True),
    Case("model_dir_without_config_json", (f"{MODEL}={{dir}}/empty",), MODEL, ("has no config.json",), setup=empty_dir("empty")),
    Case("config_json_corrupt", (f"{MODEL}={{dir}}/model",), MODEL, ("cannot read", "config.json", "fix or replace"), setup=corrupt_config_json),
    Case("config_json_missing_fields", (f"{MODEL}={{dir}}/model",), MODEL, ("lacks num_attention_heads", "config.json that came with the model"),
         setup=model_copy(drop=("num_attention_heads",))),
    Case("model_type_unsupported", (f"{MODEL}={{dir}}/model",), MODEL, ("model_type 'gpt2'", "llama, mistral, qwen2"),
         setup=model_copy({"model_type": "gpt2"})),
    Case("hidden_act_unsupported", (f"{MODEL}={{dir}}/model",), MODEL, ("hidden_act 'gelu' is not supported",),
         setup=model_copy({"hidden_act": "gelu"})),
    Case("model_dir_without_weights", (f"{MODEL}={{dir}}/model",), MODEL, ("no *.safetensors weights", "save_pretrained"),
         setup=model_copy(files=("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))),
    Case("model_dir_without_tokenizer", (f"{MODEL}={{dir}}/model", *REAL_RUN_ARGS), MODEL, ("cannot load a tokenizer", "no chat template", "tokenizer.json"),
         setup=model_copy(files=("config.json", "model.safetensors"))),
    # datasets
    Case("train_file_missing", ("data.train_files={dir}/nope.parquet",), "data.train_files", ("file does not exist", "existing parquet file")),
    Case("train_file_empty", ("data.train_files={dir}/train.parquet",), "data.train_files", ("file has no rows", "add rows to it"),
         setup=empty_parquet),
    Case("train_file_corrupt", ("data.train_files={dir}/train.parquet",), "data.train_files",
         ("train.parquet': cannot read parquet", "re-create the file"), setup=bytes_file("train.parquet", b"PAR1 not parquet"), readme=True),
    Case("val_file_corrupt", ("data.val_files={dir}/val.parquet",), "data.val_files",
         ("val.parquet': cannot read parquet", "remove it from data.val_files"), setup=bytes_file("val.parquet", b"garbage")),
    Case("prompt_column_missing", ("data.prompt_key=question",), "data.prompt_key",
         ("column 'question': column missing; the file has ['data_source', 'prompt'", "set data.prompt_key to the column"),
         readme=True),
    Case("reward_fn_key_column_missing", ("data.reward_fn_key=source",), "data.reward_fn_key",
         ("column 'source': column missing", "set data.reward_fn_key")),
    Case("prompt_too_long", ("data.train_files={dir}/train.parquet",), "data.max_prompt_length",
         ("1 of 20 prompts in data.train_files are longer and data.truncation=error", "train.parquet, row 7: 85 tokens",
          "data.filter_overlong_prompts=true"), setup=TWENTY_ROWS_ONE_LONG, subprocess=True, readme=True),
    Case("prompt_plain_string", ("data.train_files={dir}/train.parquet",), "data.prompt_key",
         ("row 0, column 'prompt': expected a non-empty list of chat messages, got str", "{role, content}"),
         setup=rows_file("train.parquet", lambda: [row(i, prompt="what is 2+2?") for i in range(20)])),
    Case("message_without_content", ("data.train_files={dir}/train.parquet",), "data.prompt_key",
         ("row 3, column 'prompt': each message must be a dict with string 'role' and 'content'",),
         setup=rows_file("train.parquet", lambda: [row(i, prompt=[{"role": "user", "content": None if i == 3 else "1"}]) for i in range(20)])),
    Case("data_source_empty", ("data.train_files={dir}/train.parquet",), "data.reward_fn_key",
         ("row 0, column 'data_source': expected a non-empty string",),
         setup=rows_file("train.parquet", lambda: [row(i, source=None if i == 0 else SOURCE) for i in range(20)])),
    Case("ground_truth_none", ("data.train_files={dir}/train.parquet",), "data.train_files",
         ("row 4: reward_model.ground_truth is None", "put the expected answer in reward_model.ground_truth"),
         setup=rows_file("train.parquet", lambda: [{**row(i), "reward_model": {"style": "rule", "ground_truth": None if i == 4 else "3"}}
                                                   for i in range(20)]), readme=True),
    Case("reward_model_none", ("data.train_files={dir}/train.parquet",), "data.train_files",
         ("row 2: reward_model is None", "(+1 more)"),
         setup=rows_file("train.parquet", lambda: [{**row(i), "reward_model": None if i in (2, 9, 11, 15) else {"style": "rule", "ground_truth": "3"}}
                                                   for i in range(20)])),
    Case("data_source_without_scorer", ("data.train_files={dir}/train.parquet",), "reward.custom_reward_function.path",
         ("without a built-in scorer: 'my_task' (first at", "row 5)", "set reward.custom_reward_function.path / name"),
         setup=rows_file("train.parquet", lambda: [row(i, source="my_task" if i >= 5 else SOURCE) for i in range(20)]), readme=True),
    Case("every_prompt_filtered_out", ("data.train_files={dir}/train.parquet", "data.filter_overlong_prompts=true"), "data.max_prompt_length",
         ("data.filter_overlong_prompts dropped every row", "raise data.max_prompt_length"),
         setup=rows_file("train.parquet", lambda: [row(i, LONG) for i in range(20)])),
    Case("train_batch_above_dataset", (f"data.train_batch_size={TRAIN_ROWS * 2}",), "data.train_batch_size",
         (f"exceeds the {TRAIN_ROWS} training prompts", f"data.train_batch_size <= {TRAIN_ROWS}")),
    Case("train_files_empty_list", ("data.train_files=[]",), "data.train_files", ("no files given",)),
    Case("train_files_remote", ("data.train_files='hdfs://nn/train.parquet'",), "data.train_files",
         ("remote paths (hdfs://, s3://) are not supported", "copy the file to local disk")),
    Case("custom_dataset_file_missing", ("data.custom_cls.path={dir}/nope.py", "data.custom_cls.name=MyData"), "data.custom_cls.path",
         ("dataset class file does not exist",)),
    Case("custom_dataset_not_a_dataset", ("data.custom_cls.path={dir}/plugins.py", "data.custom_cls.name=NotADataset"), "data.custom_cls.name",
         ("is not a torch.utils.data.Dataset subclass", "derive NotADataset from"), setup=text_file("plugins.py", PLUGINS)),
    Case("sampler_without_class_name", ("data.sampler.class_path={dir}/plugins.py",), "data.sampler.class_name",
         ("no sampler class name is given",), setup=text_file("plugins.py", PLUGINS)),
    Case("sampler_not_a_sampler", ("data.sampler.class_path={dir}/plugins.py", "data.sampler.class_name=NotASampler"), "data.sampler.class_name",
         ("is not a torch.utils.data.Sampler subclass",), setup=text_file("plugins.py", PLUGINS)),
    # custom reward function
    Case("reward_file_missing", ("custom_reward_function.path={dir}/nope.py",), "reward.custom_reward_function.path",
         ("reward function file does not exist", "existing .py file")),
    Case("reward_function_missing", ("custom_reward_function.path={dir}/plugins.py",), "reward.custom_reward_function.name",
         ("'compute_score': no function of that name", "set reward.custom_reward_function.name to a function defined in"),
         setup=text_file("plugins.py", PLUGINS), subprocess=True, readme=True),
    Case("reward_file_import_error", ("custom_reward_function.path={dir}/broken.py",), "reward.custom_reward_function.path",
         ("importing it failed", "ModuleNotFoundError"), setup=text_file("broken.py", "import not_a_real_module_xyz\n")),
    # cross-key and unsupported features
    Case("resume_path_without_dir", ("trainer.resume_mode=resume_path",), "trainer.resume_from_path", ("needs a checkpoint dir", "global_step_N")),
    Case("kl_applied_twice", ("algorithm.use_kl_in_reward=true", f"{A}.use_kl_loss=true"), "algorithm.use_kl_in_reward",
         ("the KL to the reference would be applied twice", "use one")),
    Case("gae_without_critic", ("algorithm.adv_estimator=gae", "critic.enable=false"), "critic.enable", ("needs the critic's values",)),
    Case("reward_model_without_model", ("reward_model.enable=true",), "reward.reward_model.model_path", ("no model directory given",)),
    Case("multi_turn_in_sync_mode", (f"{R}.multi_turn.enable=true", f"{R}.mode=sync"), f"{R}.multi_turn.enable",
         ("rollout.mode=async",)),
    Case("tool_config_missing", (f"{R}.multi_turn.tool_config_path=/no/such/tools.yaml",), f"{R}.multi_turn.tool_config_path",
         ("file does not exist",)),
    # issue 37 item 4: found by the driver before Ray starts, not at the first generation (exit 7)
    Case("tool_class_not_importable", (f"{R}.multi_turn.enable=true", f"{R}.multi_turn.tool_config_path={{dir}}/tools.yaml"),
         f"{R}.multi_turn.tool_config_path", ("tools[0]: cannot import 'no_such_tools_pkg.Calculator'", "ModuleNotFoundError"),
         setup=text_file("tools.yaml", "tools:\n  - class_name: no_such_tools_pkg.Calculator\n    config: {type: native}\n"),
         subprocess=True),
    Case("interaction_class_not_a_subclass", (f"{R}.multi_turn.interaction_config_path={{dir}}/interactions.yaml",),
         f"{R}.multi_turn.interaction_config_path", ("interaction[0] collections.OrderedDict is not a", "BaseInteraction"),
         setup=text_file("interactions.yaml", "interaction:\n  - name: user\n    class_name: collections.OrderedDict\n")),
    Case("agent_loop_not_importable", (f"{R}.agent.agent_loop_config_path={{dir}}/loops.yaml",), f"{R}.agent.agent_loop_config_path",
         ("agent loop 'mine'", "cannot import 'no_such_loops.Mine'"),
         setup=text_file("loops.yaml", "- name: mine\n  _target_: no_such_loops.Mine\n")),
    Case("default_agent_loop_unknown", (f"{R}.agent.default_agent_loop=mine",), f"{R}.agent.default_agent_loop",
         ("not an agent loop", "tool_agent")),
    Case("function_tools_unimplemented", (f"{R}.multi_turn.function_tool_path=tools.py",), f"{R}.multi_turn.function_tool_path",
         ("not implemented in megarl's agent loop",)),
    Case("inert_verl_key_changed", ("data.return_raw_input_ids=true",), "data.return_raw_input_ids", ("not supported", "remove the override")),
)
