"""The demo model + tokenizer run in vLLM: same greedy tokens and text as transformers.

vLLM runs in a child process (engine start ~20-80 s on CPU); the reference is an HF
transformers greedy loop on the same checkpoint.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from megarl.data.demo import MODEL_NAME
from megarl.data.demo_data import make_prompt_text

pytestmark = pytest.mark.slow

NEW_TOKENS = 8
CHILD = """
import json, sys
from vllm import LLM, SamplingParams

def main():
    model_dir, prompts = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=%d, ignore_eos=True, skip_special_tokens=True)
    outs = llm.generate(prompts, params)
    result = [{"prompt_ids": list(o.prompt_token_ids), "ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text}
              for o in outs]
    print("RESULT " + json.dumps(result), flush=True)

if __name__ == "__main__":
    main()
""" % NEW_TOKENS


def test_vllm_generates_like_transformers(demo_dir, tmp_path):
    model_dir = demo_dir / MODEL_NAME  # the session's demo model (tests/conftest.py): read only
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chats = [[{"role": "user", "content": make_prompt_text(*p)}] for p in ((7, "-", 9), (3, "+", 8))]
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    # the engine core in the child's process, as megarl's RolloutWorker runs it (a process of its own costs ~20 s here)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), json.dumps(prompts)],
        capture_output=True, text=True, timeout=500, env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    results = json.loads(lines[0][len("RESULT "):])

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, result in zip(prompts, results):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert result["prompt_ids"] == ids  # vLLM tokenizes the prompt like transformers
        seq = torch.tensor([ids])
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        hf_ids = seq[0, len(ids):].tolist()
        assert result["ids"] == hf_ids
        assert result["text"] == tokenizer.decode(hf_ids, skip_special_tokens=True)
