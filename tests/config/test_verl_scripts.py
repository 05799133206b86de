"""verl's own Megatron launch scripts, as they ship, planned by megarl (issue 34).

Each script in tests/fixtures/verl_scripts (verbatim copies at a pinned commit: SOURCES.md) is
expanded as bash would with its own defaults (tests/helpers/bash_expand.py, checked against bash
itself by test_the_expander_agrees_with_bash), `verl.trainer.main_ppo` read as `megarl.main_ppo`.
Its command line then goes through `python -m megarl.plan` as a user plans from a machine without
GPUs: the options (`--config-path` / `--config-name`), every override as written, the model path
pointed at a config-only directory with that model's config.json (tests/fixtures/verl_scripts/models)
and the data at small local parquet files. Nothing else is changed.

Each script has an expectation (EXPECTED):

- "fits": planned, and the plan fits the hardware the script is written for;
- "memory": planned, refused by the memory plan only, with the keys to change named;
- a refusal for a reason in the README's compatibility table ("npu", "sglang", "vision"), asserted
  by the refused key and message;
- "verl too": refused for a reason verl 0.9.1 refuses it as well (a key verl's config no longer has,
  a layout Megatron-Core cannot build, lengths beyond the model's context);
- "gap": refused because megarl lacks what the script needs (a model family, distillation, ...);
  an expected failure (strict xfail) naming the gap: it counts as not planned, and the test fails
  once the gap closes.

`test_scripts_planned` prints 'N of M planned' (fits + memory over all scripts).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.bash_expand import expand

import megarl.plan.__main__ as plan_cli
from megarl.config import ConfigError
from megarl.config.config_options import take_config_options

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl_scripts"
MODELS = FIXTURES / "models"
SCRIPTS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.sh"))

# The checkpoint each script names (the last part of its path) -> the model dir of its config.json.
MODEL_DIRS = {
    "Qwen3-8B": "Qwen3-8B", "Qwen3-8B-Base": "Qwen3-8B", "Qwen3-32B": "Qwen3-32B",
    "Qwen2.5-Math-7B": "Qwen2.5-Math-7B", "Qwen2.5-32B": "Qwen2.5-32B",
    "Qwen3-30B-A3B": "Qwen3-30B-A3B", "Qwen3-30B-A3B-Base": "Qwen3-30B-A3B", "Qwen3-30B-A3B-Instruct-2507": "Qwen3-30B-A3B",
    "Qwen3-235B-A22B": "Qwen3-235B-A22B", "Qwen3-235B-A22B-Instruct-2507": "Qwen3-235B-A22B",
    "DeepSeek-V3": "DeepSeek-V3", "<path_to_dsv3_config>": "DeepSeek-V3", "Moonlight-16B-A3B": "Moonlight-16B-A3B",
    "GLM-4.5-Air-Base": "GLM-4.5-Air", "MiMo-7B-RL": "MiMo-7B-RL", "gpt-oss-20b": "gpt-oss-20b",
    "Qwen3-Next-80B-A3B-Instruct": "Qwen3-Next-80B-A3B", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "Nemotron-3-Nano-30B-A3B",
    "Qwen2.5-VL-7B-Instruct": "Qwen2.5-VL-7B-Instruct", "Qwen3-VL-8B-Instruct": "Qwen3-VL-8B-Instruct",
    "Qwen3-VL-30B-A3B-Instruct": "Qwen3-VL-30B-A3B-Instruct", "Qwen3-VL-235B-A22B-Instruct": "Qwen3-VL-235B-A22B-Instruct",
    "Qwen3.5-35B-A3B": "Qwen3.5-35B-A3B", "Qwen3.5-122B-A10B": "Qwen3.5-122B-A10B", "Qwen3.5-397B-A17B": "Qwen3.5-397B-A17B",
    "DeepSeek-V4-Flash": "DeepSeek-V4-Flash", "Hy3": "Hy3",
}
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "actor_rollout_ref.model.tokenizer_path",
              "critic.model.tokenizer_path", "distillation.teacher_models.teacher_model.model_path")
DATA_KEYS = ("data.train_files", "data.val_files")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A small gsm8k-style parquet file (the plan reads no rows; a run would)."""
    root = tmp_path_factory.mktemp("verl_scripts")
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i} + {i}"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), str(root / "data.parquet"))
    return root


def command_line(script: str) -> list[str]:
    return expand((FIXTURES / script).read_text())


def localize(args: list[str], data_dir: Path) -> list[str]:
    """`args` with model paths at the config-only dirs and data files at the local parquet."""
    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        bare = key.lstrip("+~")
        if eq and bare in MODEL_KEYS:
            value = str(MODELS / MODEL_DIRS[value.rstrip("/").rsplit("/", 1)[-1]])
        elif eq and bare in DATA_KEYS:
            value = str(data_dir / "data.parquet")
        elif eq and (bare.startswith("trainer.") and bare.endswith("_dir") or bare.endswith("dist_checkpointing_path")):
            value = str(data_dir / "out")
        out.append(f"{key}{eq}{value}")
    return out


def plan(script: str, data_dir: Path, monkeypatch) -> tuple[str, list]:
    """("fits" | "memory" | "refused", the refusal's issues or the plan's)."""
    monkeypatch.setattr(plan_cli, "_local_gpu", lambda: False)
    args, option_issues = take_config_options(command_line(script))
    assert not option_issues, [i.format() for i in option_issues]
    try:
        _, issues = plan_cli.plan_text(localize(args, data_dir))
    except ConfigError as error:
        return "refused", error.issues
    return ("memory" if issues else "fits"), issues


_FAMILY = "model family megarl does not support yet (issue 34, item 5)"
_PATH = "actor_rollout_ref.model.path"
_ETP = "actor_rollout_ref.actor.megatron.expert_model_parallel_size"
# script -> (kind, the refused key (refusals), why)
EXPECTED: dict[str, tuple[str, str | None, str]] = {
    "verl-recipe/dapo/test_dapo_7b_math_megatron.sh": (
        "verl too", "data.max_response_length",
        "2048 + 8192 tokens exceed Qwen2.5-Math-7B's 4096 positions (vLLM refuses that max_model_len in verl)"),
    "verl-recipe/dapo/test_dapo_8b_megatron_fp16.sh": ("fits", None, ""),
    "verl-recipe/dapo/test_dapo_8b_megatron_fp8train.sh": ("fits", None, ""),
    "verl-recipe/dapo/test_dapo_dspk_671b_megatron_96gb.sh": ("memory", None, ""),
    "verl-recipe/dapo/test_dapo_glm_air_megatron.sh": ("memory", None, ""),  # update_actor 85.1 GiB with the fitted overhead
    "verl-recipe/dapo/test_dapo_gptoss_20b_megatron.sh": ("fits", None, ""),
    "verl-recipe/dapo/test_dapo_qwen3_moe_30b_megatron_fp16.sh": (
        "verl too", _ETP, "expert TP defaults to TP=4 and EP=8 x 4 > 8 GPUs: Megatron-Core refuses the layout in verl too"),
    "verl-recipe/dapo/test_dapo_qwen3next_80b_megatron.sh": ("fits", None, ""),  # fla in the GPU stack now
    "verl/examples/ascend_extras/grpo_trainer/run_qwen3_235b_256k_megatron.sh": ("npu", "trainer.device", "Ascend NPU"),
    "verl/examples/ascend_extras/grpo_trainer/run_qwen3_30b_a3b_megatron.sh": ("npu", "trainer.device", "Ascend NPU"),
    "verl/examples/ascend_extras/grpo_trainer/run_qwen3_5_122b_a10b_32k_megatron.sh": ("npu", _PATH, "Ascend NPU (MindSpeed keys)"),
    "verl/examples/dppo_trainer/run_qwen3_30b_a3b_megatron.sh": ("memory", None, ""),
    "verl/examples/gpg_trainer/run_qwen3_8b_megatron.sh": ("memory", None, ""),  # update_actor 81.2 GiB, as grpo's script
    "verl/examples/grpo_trainer/run_deepseek_v3_671b_megatron.sh": ("fits", None, ""),  # Megatron's CPU optimizer
    "verl/examples/grpo_trainer/run_deepseek_v4_flash_megatron.sh": (  # the script follows verl's main branch
        "verl too", "data.continuous_token.enable",
        "data.continuous_token.* is not a key of verl 0.9.1's config (its agent loop picks the token builder by "
        "model_type); past it, DeepSeek-V4 (hyper-connections, compressed sparse attention) needs the Megatron-LM "
        "development commit the script pins, newer than megatron-core 0.19.2"),
    "verl/examples/grpo_trainer/run_hy_v3_megatron.sh": ("fits", None, ""),  # 59 GiB peak (generate) of 80
    "verl/examples/grpo_trainer/run_moonlight_16b_a3b_megatron.sh": ("fits", None, ""),
    "verl/examples/grpo_trainer/run_nemotron_nano_v3_30b_a3b_megatron.sh": (
        "gap", _PATH, "Nemotron-H: megarl builds it; its Mamba-2 layers need mamba-ssm and causal-conv1d on CUDA, which "
        "megarl's GPU stack (requirements/gpu-lock.txt) does not ship (with them the script fits: "
        "test_nemotron_nano_script_fits_with_the_mamba_kernels)"),
    "verl/examples/grpo_trainer/run_qwen2-7b_math_megatron_fsdp.sh": ("fits", None, ""),
    "verl/examples/grpo_trainer/run_qwen2_5_vl_7b_megatron.sh": ("vision", _PATH, "Qwen2.5-VL"),
    "verl/examples/grpo_trainer/run_qwen3_235b_a22b_megatron.sh": (
        "verl too", "actor_rollout_ref.rollout.expert_parallel_size",
        "rollout EP=64 at rollout TP=8 with data_parallel_size unset (1; the script sets it only for NPU or with "
        "ROLLOUT_DP): verl 0.9.1's RolloutConfig asserts expert_parallel_size == tp x dp"),
    "verl/examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh": (
        "verl too", "actor_rollout_ref.rollout.moe_tensor_parallel_size",
        "rollout MoE TP is a trtllm setting verl refuses with vLLM, the script's default backend"),
    "verl/examples/grpo_trainer/run_qwen3_5_122b_a10b_megatron.sh": ("vision", _PATH, "Qwen3.5 (vision-language)"),
    "verl/examples/grpo_trainer/run_qwen3_5_35b_megatron.sh": ("vision", _PATH, "Qwen3.5 (vision-language)"),
    "verl/examples/grpo_trainer/run_qwen3_5_397b_megatron.sh": ("vision", _PATH, "Qwen3.5 (vision-language)"),
    "verl/examples/grpo_trainer/run_qwen3_8b_megatron.sh": ("memory", None, ""),
    "verl/examples/grpo_trainer/run_qwen3_vl_235b_a22b_megatron.sh": ("vision", _PATH, "Qwen3-VL"),
    "verl/examples/grpo_trainer/run_qwen3_vl_30b_a3b_megatron.sh": ("vision", _PATH, "Qwen3-VL"),
    "verl/examples/grpo_trainer/run_qwen3_vl_8b_megatron.sh": ("vision", _PATH, "Qwen3-VL"),
    "verl/examples/gspo_trainer/run_qwen3_30b_a3b_megatron.sh": ("memory", None, ""),
    "verl/examples/mtp_trainer/run_mimo_7b_mtp_megatron.sh": ("sglang", "actor_rollout_ref.rollout.name", "SGLang rollout"),
    "verl/examples/mtp_trainer/run_mimo_7b_mtp_rl_vllm_sgl_megatron.sh": (
        "sglang", "actor_rollout_ref.rollout.name", "SGLang rollout"),
    "verl/examples/on_policy_distillation_trainer/run_qwen3_8b_megatron.sh": ("memory", None, ""),
    "verl/examples/ppo_trainer/run_qwen3_8b_megatron.sh": ("memory", None, ""),
    "verl/examples/router_replay/run_qwen3_30b_a3b_megatron.sh": (
        "verl too", "actor_rollout_ref.actor.model_engine", "actor.model_engine is not a key of verl 0.9.1's config"),
    "verl/examples/tuning/lora/run_qwen3_30b_a3b_megatron.sh": ("fits", None, ""),  # LoRA on TE's linears, experts ETP=1
    "verl/examples/tuning/scaling/run_qwen2_5_32b_megatron.sh": (
        "verl too", "actor_rollout_ref.actor.model_engine", "actor.model_engine is not a key of verl 0.9.1's config"),
}
PLANNED = ("fits", "memory")


def test_every_script_has_an_expectation():
    assert set(EXPECTED) == set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_verl_script(script, data, monkeypatch, capsys):
    want, key, why = EXPECTED[script]
    got, issues = plan(script, data, monkeypatch)
    with capsys.disabled():
        print(f"\n{script}: {got}" + "".join(f"\n    {i.format()}" for i in issues))
    if want == "gap":
        assert got == "refused" and key in {i.key for i in issues}, [i.format() for i in issues]
        pytest.xfail(f"megarl gap: {why}")
    if want in PLANNED:
        assert got == want, [i.format() for i in issues]
        for issue in issues:  # a memory refusal names the keys to change
            assert "needs" in issue.problem and "GiB per GPU" in issue.problem and issue.fix, issue.format()
        return
    assert got == "refused" and key in {i.key for i in issues}, (want, why, [i.format() for i in issues])
    if want == "npu":
        assert any("npu" in repr(i.value).lower() or "mindspeed" in i.problem.lower() or i.key == _PATH
                   for i in issues)
    if want == "sglang":
        assert any(i.value == "sglang" for i in issues)
    if want == "vision":  # one issue that says so, not a missing field or a missing expert count
        assert [i.key for i in issues] == [_PATH] and "vision-language model" in issues[0].problem, \
            [i.format() for i in issues]


def test_nemotron_nano_script_fits_with_the_mamba_kernels(data, monkeypatch):
    """verl's Nemotron-3-Nano script as it ships (TP=8 over 2 KV heads: replicated, EP=8), on a GPU stack that has
    the mamba-ssm and causal-conv1d its header installs: planned, and it fits 8 x 80 GB."""
    from megarl.config.rules.model import MAMBA_MODULES

    shipped = plan_cli.in_gpu_stack
    monkeypatch.setattr(plan_cli, "in_gpu_stack", lambda module: module in MAMBA_MODULES or shipped(module))
    got, issues = plan("verl/examples/grpo_trainer/run_nemotron_nano_v3_30b_a3b_megatron.sh", data, monkeypatch)
    assert (got, issues) == ("fits", []), [i.format() for i in issues]


def test_scripts_planned(data, monkeypatch, capsys):
    """N of M planned: fits, or refused by the memory plan alone (from the expectations, which
    test_verl_script holds each script to)."""
    planned = sorted(s for s, (kind, _, _) in EXPECTED.items() if kind in PLANNED)
    fits = sum(EXPECTED[s][0] == "fits" for s in planned)
    with capsys.disabled():
        print(f"\nverl's Megatron example scripts: {len(planned)} of {len(SCRIPTS)} planned "
              f"({fits} fit, {len(planned) - fits} refused by the memory plan); "
              + ", ".join(f"{sum(k == kind for k, _, _ in EXPECTED.values())} {kind}"
                          for kind in ("verl too", "npu", "sglang", "vision", "gap")))


def test_the_expander_agrees_with_bash(tmp_path):
    """Each script run by bash itself, its launcher replaced by a recorder of its arguments (the
    environment empty but for PATH; HOME=~, as the expander takes it), gives the expander's
    command line; $PWD and $(date) differ by design and are left out."""
    recorder = ("rec() { while [ $# -gt 0 ]; do if [ \"$1\" = verl.trainer.main_ppo ]; then shift; "
                "printf '%s\\0' \"$@\" > \"$REC_OUT\"; exit 0; fi; shift; done; }\n")
    checked = 0
    for script in SCRIPTS:
        text = (FIXTURES / script).read_text()
        if "$(date" in text or "${PWD}" in text or "$PWD" in text:
            continue
        body = re.sub(r"\b(python3?|ray|huggingface-cli|hf|cp|cat|wget|pip)\b(?=\s)", r"rec \1", text)
        out = tmp_path / "args"
        env = {"PATH": os.environ["PATH"], "HOME": "~", "REC_OUT": str(out),
               "DEVICE": "gpu"}  # what the scripts' torch_npu probe gives on a GPU node (COMMAND_SUBSTITUTIONS)
        proc = subprocess.run(["bash", "-c", recorder + body], env=env, cwd=tmp_path, capture_output=True, timeout=60)
        if not out.exists() and "unbound variable" in proc.stderr.decode():
            continue  # `set -u` with a variable the script expects from the environment (DeepSeek-V4's HDFS_ROOT)
        assert out.exists(), (script, proc.stderr.decode()[-2000:])
        theirs = [a for a in out.read_bytes().decode().split("\0")[:-1] if a != "\\"]  # a trailing `\` at EOF
        out.unlink()
        assert command_line(script) == theirs, script
        checked += 1
    assert checked >= 24  # of 37: the others print $(date) or $PWD, or need a variable from the environment
