"""End to end on CPU through Ray: one GRPO step of the demo scored by a learned reward model.

The reward model is a tiny Qwen2ForSequenceClassification on the demo tokenizer with its own
chat template, so the trainer re-renders each row's chat + response with it. Reference: every
dumped response re-scored by HF transformers' forward on that rendering must equal the score the
run trained on (verl: the reward model's score replaces the rule reward).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from e2e_utils import demo_config, read_metrics, read_rollouts

# ~60 s (Ray + vLLM start-up): extended tier; the scores themselves are checked against HF in the
# default tier by tests/workers/test_reward_model.py, the rendering by tests/reward/test_rm_inputs.py
pytestmark = [pytest.mark.slow, pytest.mark.extended]

RM_TEMPLATE = "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + ' ' }}{% endfor %}"


def make_demo_reward_model(out_dir: str) -> str:
    from megarl.data.demo_tokenizer import build_demo_tokenizer

    tok = build_demo_tokenizer()
    tok.chat_template = RM_TEMPLATE
    config = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      num_labels=1, pad_token_id=tok.pad_token_id, tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


def test_grpo_step_scored_by_reward_model(demo_dir, tmp_path_factory, tmp_path):
    rm_dir = make_demo_reward_model(str(tmp_path_factory.mktemp("rm")))
    cfg = demo_config(demo_dir, tmp_path, [
        "trainer.total_training_steps=1", "trainer.test_freq=-1", "algorithm.adv_estimator=grpo",
        "reward.reward_model.enable=true", f"reward.reward_model.model_path={rm_dir}",
        "reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "reward.reward_model.rollout.dtype=float32", "reward.reward_model.rollout.max_num_seqs=5",
    ])
    from megarl.trainer import run_ppo

    run_ppo(cfg)
    m = read_metrics(tmp_path)[1]
    assert m["timing_s/reward_model"] > 0 and "timing_s/reward" not in m  # the rule reward did not run
    assert m["reward_model/truncated_ratio"] == 0.0 and "actor/pg_loss" in m
    rows = read_rollouts(tmp_path, 1)
    tok = transformers.AutoTokenizer.from_pretrained(rm_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # the dumped prompt is the user turn's text (role markers are special tokens)
        want = [model(input_ids=torch.tensor([tok.apply_chat_template(
                    [{"role": "user", "content": r["input"]}, {"role": "assistant", "content": r["output"]}],
                    tokenize=True, return_dict=False)])).logits[0, 0].item() for r in rows]
    assert len(set(round(w, 4) for w in want)) > 1  # different responses score differently
    assert [r["score"] for r in rows] == pytest.approx(want, abs=1e-4)
    assert m["critic/score/mean"] == pytest.approx(sum(want) / len(want), abs=1e-4)
