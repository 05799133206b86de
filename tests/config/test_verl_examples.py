"""verl's Megatron example scripts validate in megarl (issue 14).

Each script's overrides (tests/fixtures/verl_megatron_examples.py), with the author's paths
pointed at local files, go through what `python -m megarl.main_ppo <overrides>` runs before any
worker starts: the command-line key check, composition (Hydra, legacy-key migration), validation
and preflight. Every issue must be one of

- hardware: this machine is not the cluster the script asks for (trainer.nnodes,
  trainer.n_gpus_per_node, trainer.device; sequence parallelism, the precision-aware optimizer,
  FP8 or TE's fused kernels without transformer-engine);
- refused: a verl feature megarl documents as not implemented (a `refuse` rule in verl_compat/accepted_keys.py);
- stale: a plain override of a key verl 0.9.1 itself does not have (absent from its generated
  config, tests/fixtures/verl_0.9.1_ppo_megatron_trainer.yaml), so verl's Hydra rejects it too;
  a `+key` addition of such a key must get a documented reason ("not accepted: ...");
- known: listed in KNOWN below with the reason (verl fails the same way, or it follows from a
  refused feature, or the script needs another Megatron-Core);
- gap: listed in GAPS: a verl feature megarl lacks that verl_compat/accepted_keys.py does not list; the script's
  test is an expected failure (xfail) naming it, and fails once the gap is closed (remove it then).

Anything else fails the test. Each script's model is a config.json with the real model's layer /
head / expert counts (tiny widths, no weights: only shapes are checked before workers start) and
the demo tokenizer. Run with `-s` to see what is left per script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from config_testing import issue_for, no_issues
from megarl.config import ConfigError, Issue, check_override_keys, collect_issues, load_config, resolve_config
from megarl.config.verl_compat.accepted_keys import rule_for

from fixtures.verl_megatron_examples import EXAMPLES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

VERL_YAML = FIXTURES / "verl_0.9.1_ppo_megatron_trainer.yaml"
HARDWARE_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.device")

# The real model's shape per script, built as a model type megarl has (only the counts matter here).
QWEN3_8B = {"model_type": "qwen3", "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "num_experts": 128}
SHAPES: dict[str, dict[str, Any]] = {
    "grpo_trainer/run_qwen3_8b_megatron.sh": QWEN3_8B,
    "grpo_trainer/run_qwen3_30b_a3b_megatron.sh": QWEN3_30B_A3B,
    "grpo_trainer/run_qwen3_235b_a22b_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 94,
                                                     "num_attention_heads": 64, "num_key_value_heads": 4, "num_experts": 128},
    # MLA models (Moonlight, DeepSeek): one KV head per query head
    "grpo_trainer/run_moonlight_16b_a3b_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 27,
                                                       "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64},
    "grpo_trainer/run_deepseek_v3_671b_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 61,
                                                      "num_attention_heads": 128, "num_key_value_heads": 128, "num_experts": 256},
    "grpo_trainer/run_deepseek_v4_flash_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 43,
                                                       "num_attention_heads": 64, "num_key_value_heads": 64, "num_experts": 256},
    "grpo_trainer/run_hy_v3_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 80, "num_attention_heads": 64,
                                           "num_key_value_heads": 8, "num_experts": 192},
    "grpo_trainer/run_nemotron_nano_v3_30b_a3b_megatron.sh": {"model_type": "qwen3_moe", "num_hidden_layers": 52,
                                                              "num_attention_heads": 32, "num_key_value_heads": 8, "num_experts": 128},
    "grpo_trainer/run_qwen2-7b_math_megatron_fsdp.sh": {"model_type": "qwen2", "num_hidden_layers": 28,
                                                        "num_attention_heads": 28, "num_key_value_heads": 4},
    "ppo_trainer/run_qwen3_8b_megatron.sh": QWEN3_8B,
    "gpg_trainer/run_qwen3_8b_megatron.sh": QWEN3_8B,
    "gspo_trainer/run_qwen3_30b_a3b_megatron.sh": QWEN3_30B_A3B,
    "dppo_trainer/run_qwen3_30b_a3b_megatron.sh": QWEN3_30B_A3B,
    "router_replay/run_qwen3_30b_a3b_megatron.sh": QWEN3_30B_A3B,
    "on_policy_distillation_trainer/run_qwen3_8b_megatron.sh": QWEN3_8B,
    "mtp_trainer/run_mimo_7b_mtp_rl_vllm_sgl_megatron.sh": {"model_type": "qwen2", "num_hidden_layers": 36,
                                                            "num_attention_heads": 32, "num_key_value_heads": 8},
    "lora/run_qwen3_30b_a3b_megatron.sh": QWEN3_30B_A3B,
    "scaling/run_qwen2_5_32b_megatron.sh": {"model_type": "qwen2", "num_hidden_layers": 64, "num_attention_heads": 40,
                                            "num_key_value_heads": 8},
}

_ETP = ("verl fails the same way: expert TP defaults to TP, and Megatron-Core's initialize_model_parallel "
        "needs world size divisible by expert TP x EP x PP ({})")
# Issues expected for a documented reason (script -> key -> reason).
KNOWN: dict[str, dict[str, str]] = {
    "grpo_trainer/run_qwen3_30b_a3b_megatron.sh": {
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size": _ETP.format("8 GPUs vs 4 x 2 x 2"),
    },
    "grpo_trainer/run_qwen3_235b_a22b_megatron.sh": {
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size": _ETP.format("64 GPUs vs 4 x 4 x 8"),
        "actor_rollout_ref.ref.megatron.expert_model_parallel_size": _ETP.format("64 GPUs vs 4 x 4 x 8"),
    },
    "grpo_trainer/run_deepseek_v4_flash_megatron.sh": {
        "actor_rollout_ref.actor.megatron.override_transformer_config.apply_dsa_kernel_fusion":
            "the script needs the Megatron-LM commit it names (DeepSeek-V4 fields); megatron-core 0.16 has no such field",
        "actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_mhc":
            "the script needs the Megatron-LM commit it names (DeepSeek-V4 fields); megatron-core 0.16 has no such field",
    },
}
# verl features megarl lacks and verl_compat/accepted_keys.py does not list (script -> key -> what is missing).
GAPS: dict[str, dict[str, str]] = {
    "lora/run_qwen3_30b_a3b_megatron.sh": {
        "actor_rollout_ref.model.lora.rank": "megarl's LoRA adapts dense layers only (no adapters on MoE experts)",
    },
}

# Keys whose values name the script author's files: pointed at local assets.
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "actor_rollout_ref.model.tokenizer_path", "data.tokenizer",
              "distillation.teacher_models.teacher_model.model_path")
DIR_KEYS = ("trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir",
            "actor_rollout_ref.actor.megatron.dist_checkpointing_path", "actor_rollout_ref.ref.megatron.dist_checkpointing_path",
            "critic.megatron.dist_checkpointing_path")
CLI_OPTIONS = ("--config-path=config", "--config-name=ppo_megatron_trainer.yaml", "--config-name=ppo_megatron_trainer")


def _write_model(model_dir: Path, shape: dict[str, Any]) -> None:
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    heads = shape["num_attention_heads"]
    hf = {"architectures": ["ForCausalLM"], "hidden_size": 4 * heads, "head_dim": 4, "intermediate_size": 64,
          "vocab_size": 64, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, **shape}
    if shape["model_type"] == "qwen3_moe":
        hf.update(num_experts_per_tok=8, moe_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[])
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(hf))
    (model_dir / "model.safetensors").touch()  # only its presence is checked before workers start
    build_demo_tokenizer().save_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """gsm8k-style parquet files (as many training rows as the largest data.train_batch_size of
    the scripts) and a dir for outputs."""
    root = tmp_path_factory.mktemp("verl_examples")
    sizes = [int(a.split("=", 1)[1]) for args in EXAMPLES.values() for a in args if a.startswith("data.train_batch_size=")]
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i} + {i}"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}} for i in range(max(sizes))]
    pq.write_table(pa.Table.from_pylist(rows), str(root / "train.parquet"))
    pq.write_table(pa.Table.from_pylist(rows[:8]), str(root / "val.parquet"))
    (root / "dirs").mkdir()
    return root


def localize(overrides: list[str], root: Path, model: Path) -> list[str]:
    """`overrides` with the author's paths replaced by local assets."""
    out = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        bare = key.lstrip("+~")
        if eq and bare in MODEL_KEYS:
            value = str(model)
        elif eq and bare in ("data.train_files", "data.val_files"):
            value = str(root / ("train.parquet" if bare == "data.train_files" else "val.parquet"))
        elif eq and bare in DIR_KEYS:
            value = str(root / "dirs")
        out.append(f"{key}{eq}{value}")
    return out


def _verl_keys() -> set[str]:
    def walk(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    return set(walk(OmegaConf.to_container(OmegaConf.load(VERL_YAML), resolve=False)))


VERL_KEYS = _verl_keys()


def classify(issue: Issue, script: str, added: set[str]) -> str:
    """The issue's category (see the module docstring); `added`: keys given as `+key=`."""
    if (issue.key in HARDWARE_KEYS
            or (issue.key.endswith(".optim.use_precision_aware_optimizer") and "cannot run here" in issue.problem)
            or "(transformer-engine is not installed)" in issue.problem):  # TE's fused kernels, FP8
        return "hardware"
    rule = rule_for(issue.key)
    if rule is not None and rule.kind == "refuse":
        return "refused"
    in_verl = any(issue.key == k or issue.key.startswith(k + ".") for k in VERL_KEYS)
    if issue.problem.startswith(("unknown key", "not accepted")) and not in_verl:
        if issue.key not in added or issue.problem.startswith("not accepted"):
            return "stale"
    if issue.key in KNOWN.get(script, {}):
        return "known"
    if issue.key in GAPS.get(script, {}):
        return "gap"
    return "error"


def run_script(overrides: list[str]) -> tuple[list[Issue], list[str]]:
    """What `python -m megarl.main_ppo <overrides>` reports before any worker starts: the
    command-line key check, validation and preflight. The CLI stops at the first stage with
    issues; here every stage runs (without the overrides the key check refused) to show all
    at once. Returns the issues and the notices of accepted no-effect keys."""
    from megarl.preflight.run import preflight
    from megarl.config.verl_compat.check import compat_notices

    args = [a for a in overrides if not a.startswith("-")]
    issues = check_override_keys(args)
    refused = {i.key for i in issues}
    cfg = load_config([a for a in args if a.split("=", 1)[0].lstrip("+~") not in refused])
    issues += collect_issues(cfg)
    try:
        preflight(resolve_config(cfg))
    except ConfigError as error:
        issues += error.issues
    return issues, compat_notices(cfg)


def test_every_script_has_a_model_shape_and_known_entries_name_scripts():
    assert set(SHAPES) == set(EXAMPLES)
    assert set(KNOWN) <= set(EXAMPLES) and set(GAPS) <= set(EXAMPLES)


@pytest.mark.parametrize("script", list(EXAMPLES))
def test_verl_example_script_validates(script, assets, capsys):
    model = assets / script.replace("/", "_")
    _write_model(model, SHAPES[script])
    options = [a for a in EXAMPLES[script] if a.startswith("-")]
    assert set(options) <= set(CLI_OPTIONS), f"command-line options megarl.main_ppo is not known to take: {options}"
    overrides = localize(EXAMPLES[script], assets, model)
    added = {a.split("=", 1)[0].lstrip("+") for a in overrides if a.startswith("+")}
    issues, notices = run_script(overrides)
    kinds: dict[str, list[Issue]] = {}
    for issue in issues:
        kinds.setdefault(classify(issue, script, added), []).append(issue)
    reasons = {**KNOWN.get(script, {}), **GAPS.get(script, {})}
    with capsys.disabled():
        print(f"\n{script}:")
        for kind, found in sorted(kinds.items()):
            for issue in found:
                why = f"  <- {reasons[issue.key]}" if kind in ("known", "gap") else ""
                print(f"  [{kind}] {issue.key}: {issue.problem}{why}")
        for notice in notices:
            print(f"  [no effect] {notice}")
    errors = kinds.get("error", [])
    assert not errors, "\n".join(i.format() for i in errors)
    expected = set(KNOWN.get(script, {})) | set(GAPS.get(script, {}))
    stale = expected - {i.key for i in issues}
    assert not stale, f"KNOWN / GAPS entries no longer reported (remove them): {sorted(stale)}"
    if kinds.get("gap"):
        pytest.xfail("; ".join(sorted({GAPS[script][i.key] for i in kinds["gap"]})))


# ------------------------------------------------------------------ what the scripts needed
def test_model_engine_megatron_is_accepted_and_others_are_refused(make):
    no_issues(make({"model_engine": "megatron"}))
    issue_for(make({"model_engine": "dp"}), "model_engine", "Megatron-Core only")


def test_reward_model_reward_kwargs_move_to_reward_reward_kwargs():
    """verl's migrate_legacy_reward_impl: reward_model.reward_kwargs -> reward.reward_kwargs (DAPO scripts)."""
    cfg = load_config(["actor_rollout_ref.model.path=/placeholder", "reward_model.reward_manager=dapo",
                       "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                       "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096", "+reward_model.reward_kwargs.max_resp_len=8192"])
    assert OmegaConf.to_container(cfg.reward.reward_kwargs) == {"overlong_buffer_cfg": {"enable": True, "len": 4096}, "max_resp_len": 8192}
    assert "reward_kwargs" not in cfg.reward_model and cfg.reward.reward_manager.name == "dapo"


@pytest.mark.parametrize("split, ok", [
    ({"num_layers_in_first_pipeline_stage": 11, "num_layers_in_last_pipeline_stage": 11}, True),  # 11 + 6 x 12 + 11 = 94
    ({"num_layers_in_first_pipeline_stage": 10, "num_layers_in_last_pipeline_stage": 11}, False),  # 73 middle layers over 6
    ({"pipeline_model_parallel_layout": "Et*12|t*12|t*12|t*12|t*12|t*12|t*12|t*10L"}, True),  # 94 layers in 8 stages
    ({"pipeline_model_parallel_layout": "Et*12|t*12|t*12|t*12|t*12|t*12|t*12|t*12L"}, False),  # 96 layers
])
def test_an_uneven_pipeline_split_is_judged_by_megatron(make, split, ok):
    """pp=8 does not divide 94 layers; Megatron-Core takes an explicit uneven split (verl's Qwen3-235B script)."""
    key = "actor_rollout_ref.actor.megatron"
    overrides = {f"{key}.pipeline_model_parallel_size": 8, "trainer.n_gpus_per_node": 8,
                 "actor_rollout_ref.actor.megatron.sequence_parallel": False,
                 **{f"{key}.override_transformer_config.{k}": v for k, v in split.items()}}
    cfg = make(overrides, hf={"num_hidden_layers": 94})
    keys = [i.key for i in collect_issues(cfg)]
    assert (f"{key}.override_transformer_config" not in keys and f"{key}.pipeline_model_parallel_size" not in keys) is ok, keys
    if not ok:
        issue_for(cfg, f"{key}.override_transformer_config", "Megatron-Core refuses this pipeline split")
    issue_for(make({f"{key}.pipeline_model_parallel_size": 8, "trainer.n_gpus_per_node": 8}, hf={"num_hidden_layers": 94}),
              f"{key}.pipeline_model_parallel_size", "does not divide num_hidden_layers=94", "num_layers_in_first_pipeline_stage")


def test_verls_config_path_option_finds_megarls_config(tmp_path):
    """verl's scripts pass `--config-path=config --config-name=ppo_megatron_trainer.yaml`."""
    env = {**os.environ, "MEGARL_DEMO_DIR": str(tmp_path / "demo"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "megarl.main_ppo", "--config-path=config", "--config-name=ppo_megatron_trainer.yaml",
         "trainer.total_training_steps=abc", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "trainer.total_training_steps = 'abc'" in proc.stderr, proc.stdout + proc.stderr
