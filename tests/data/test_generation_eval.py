"""main_generation -> main_eval round trip on the demo task (verl's entry points and configs).

Greedy generation from the demo model in vLLM must equal transformers' greedy `generate` on the
same chat prompts (independent reference), and main_eval's scores must equal the demo scorer
applied by hand to those reference responses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from megarl.data.demo import BUILDERS, MODEL_NAME, VAL_NAME
from megarl.reward.demo_task import compute_score

pytestmark = pytest.mark.slow

ROWS, RESPONSE_LENGTH = 6, 8


def _run(module: str, *overrides: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *overrides, f"hydra.run.dir={cwd}/hydra"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_generation_then_eval_round_trip(demo_dir, tmp_path):
    import transformers

    assert MODEL_NAME in BUILDERS and VAL_NAME in BUILDERS
    model_dir = demo_dir / MODEL_NAME  # the session's demo assets (tests/conftest.py): read only
    rows = pq.read_table(str(demo_dir / VAL_NAME)).slice(0, ROWS)
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(rows, str(prompts))
    generations = tmp_path / "out" / "gen.parquet"

    gen = _run("megarl.main_generation", "trainer.device=cpu", "trainer.n_gpus_per_node=1", f"data.path={prompts}",
               f"data.output_path={generations}", f"model.path={model_dir}", "data.n_samples=1", "data.batch_size=4",
               "rollout.temperature=0", "rollout.dtype=float32", "rollout.prompt_length=32",
               f"rollout.response_length={RESPONSE_LENGTH}", cwd=tmp_path)
    assert gen.returncode == 0, gen.stdout[-3000:] + gen.stderr[-3000:]
    out = pq.read_table(str(generations))
    assert out.column_names == rows.column_names + ["responses"]
    assert out.drop(["responses"]).equals(rows)  # the input rows, unchanged
    responses = out.column("responses").to_pylist()

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    want = []
    for chat in rows.column("prompt").to_pylist():
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(ids, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=RESPONSE_LENGTH,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        want.append([tokenizer.decode(seq[0, ids.shape[1]:], skip_special_tokens=True)])
    assert responses == want

    ev = _run("megarl.main_eval", f"data.path={generations}", "ray_kwargs.ray_init.num_cpus=1", cwd=tmp_path)
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    metrics = json.loads(ev.stdout.strip().splitlines()[-1])
    truths = [r["ground_truth"] for r in rows.column("reward_model").to_pylist()]
    scores = [compute_score(w[0], t) for w, t in zip(want, truths)]
    (source,) = set(rows.column("data_source").to_pylist())
    assert metrics == {f"test_score/{source}": pytest.approx(sum(scores) / ROWS),
                       f"pass@1/{source}": pytest.approx(sum(s >= 1.0 for s in scores) / ROWS)}
