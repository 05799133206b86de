"""Write a random Qwen2.5-0.5B-shaped policy with the demo tokenizer (issue 23's GRPO run).

  MEGARL_DEMO_DIR=/tmp/demo python benchmarks/grpo_model_dir.py /tmp/q05 [--config-only] [--moe | --llama | --7b [--llama] | --8b | --30b [--layers N]]

Builds the demo assets (tokenizer, data) if missing, then saves a randomly initialised
Qwen2 of Qwen2.5-0.5B's shape (vocabulary = the demo tokenizer's) in bf16 with the tokenizer
files, so `actor_rollout_ref.model.path=/tmp/q05` runs the demo task at that size.
``--moe``: a Qwen3-MoE of about the same active size instead (8 experts, top 2, 12 layers),
for expert-parallel runs. ``--llama``: the same shape as a Llama (no q/k/v bias), for the verl side by
side: verl 0.9.1's agent loop picks its token builder by ``model_type``, and its Qwen builder needs a
tokenizer where "\\n" is one token, which the demo tokenizer does not have. ``--7b``: Qwen2.5-7B's shape
with its real vocabulary size (152,064; the demo tokenizer padded with ``<reserved_k>`` entries, so every
id the random policy samples decodes), untied embeddings (issue 31's scale runs; built on the GPU); with
``--llama`` the same shape as a Llama (verl's 7B side by side, for the reason above).
``--8b``: Qwen3-8B's shape (36 layers, hidden 4,096, q/k norms, vocabulary 151,936, untied; verl's Qwen3-8B
GRPO script's model, issue 34). ``--30b``: Qwen3-30B-A3B's shape (48 layers, 128 experts top 8, its real vocabulary 151,936, untied; issue 35;
built on the GPU, 61 GB in bf16); ``--layers N`` keeps N of its layers (what fits 4 or 2 GPUs' training state).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers

from megarl.data.demo import MODEL_NAME, build_asset


def main() -> None:
    out = Path(sys.argv[1])  # flags after it
    demo_model = build_asset(MODEL_NAME)
    for split in ("train.parquet", "val.parquet"):
        build_asset(split)
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    vocab = (QWEN25_7B_VOCAB if "--7b" in sys.argv else QWEN3_30B_VOCAB if ("--30b" in sys.argv or "--8b" in sys.argv)
             else len(tok))
    common = dict(vocab_size=vocab, max_position_embeddings=1024, rope_theta=1e6, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, dtype="bfloat16")
    if "--moe" in sys.argv:
        cfg = transformers.Qwen3MoeConfig(
            hidden_size=896, intermediate_size=2432, moe_intermediate_size=1216, num_hidden_layers=12,
            num_attention_heads=14, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], **common)
    elif "--30b" in sys.argv:
        layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else 48
        common.update(tie_word_embeddings=False, max_position_embeddings=40960)
        cfg = transformers.Qwen3MoeConfig(
            hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], **common)
    elif "--8b" in sys.argv:
        common.update(tie_word_embeddings=False, max_position_embeddings=40960)
        cfg = transformers.Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, **common)
    elif "--7b" in sys.argv:
        common.update(tie_word_embeddings=False, max_position_embeddings=32768)
        shape = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, **common)
        cfg = transformers.LlamaConfig(**shape) if "--llama" in sys.argv else transformers.Qwen2Config(**shape)
    elif "--llama" in sys.argv:
        cfg = transformers.LlamaConfig(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, head_dim=64, **common)
    else:
        cfg = transformers.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, **common)
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
    if vocab > len(tok):
        pad_tokenizer(out / "tokenizer.json", vocab)


QWEN25_7B_VOCAB = 152064
QWEN3_30B_VOCAB = 151936


def pad_tokenizer(path, size: int) -> None:
    """Add ``<reserved_k>`` entries to the BPE vocabulary of ``path`` until it has ``size`` ids."""
    data = json.loads(path.read_text())
    table = data["model"]["vocab"]
    taken = set(table.values()) | {t["id"] for t in data.get("added_tokens", [])}
    k = 0
    for token_id in range(size):
        if token_id not in taken:
            while f"<reserved_{k}>" in table:
                k += 1
            table[f"<reserved_{k}>"] = token_id
            k += 1
    path.write_text(json.dumps(data, ensure_ascii=False))


if __name__ == "__main__":
    main()
