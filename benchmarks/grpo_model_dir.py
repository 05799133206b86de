"""Write a random Qwen2.5-0.5B-shaped policy with the demo tokenizer (issue 23's GRPO run).

  MEGARL_DEMO_DIR=/tmp/demo python benchmarks/grpo_model_dir.py /tmp/q05 [--config-only]

Builds the demo assets (tokenizer, data) if missing, then saves a randomly initialised
Qwen2 of Qwen2.5-0.5B's shape (vocabulary = the demo tokenizer's) in bf16 with the tokenizer
files, so `actor_rollout_ref.model.path=/tmp/q05` runs the demo task at that size.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import transformers

from megarl.data.demo import MODEL_NAME, build_asset


def main() -> None:
    out = Path(sys.argv[1])
    demo_model = build_asset(MODEL_NAME)
    for split in ("train.parquet", "val.parquet"):
        build_asset(split)
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    cfg = transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, dtype="bfloat16",
    )
    out.mkdir(parents=True, exist_ok=True)
    if "--config-only" in sys.argv:
        cfg.save_pretrained(out)
    else:
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
    for f in demo_model.iterdir():
        if not f.name.startswith(("model", "config")) and f.is_file():
            shutil.copy2(f, out / f.name)


if __name__ == "__main__":
    main()
