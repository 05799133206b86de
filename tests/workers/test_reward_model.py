"""The Megatron reward-model worker against HF transformers' sequence-classification forward.

Tiny Qwen2 and Llama `*ForSequenceClassification` models (num_labels 1, random score head) are
built from config and saved; the worker's score of every row must equal HF's `logits[0, 0]` of
that row alone (no padding: HF reads the last token), fp32, at TP=2 (micro-batches of 3 rows,
weights offloaded between calls: rollout.free_cache_engine) and, in the extended tier, TP=1 (one
micro-batch, weights kept on the device).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf

from helpers.dist_utils import run_distributed
from helpers.tiny import unusual_norms_and_biases_
from megarl.config.files import CONFIG_DIR, CONFIG_NAME

pytestmark = pytest.mark.slow

VOCAB, PAD = 97, 96  # rows use ids < PAD, so HF's last-non-pad-token rule reads each row's last token


def make_tiny_reward_model(out_dir: str, family: str, seed: int = 0) -> str:
    """Random-init `*ForSequenceClassification` (num_labels 1) with non-default norms and biases and
    a score head of std 1 (scores of order 1), saved as fp32 safetensors."""
    cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[family]
    config = cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 num_labels=1, pad_token_id=PAD, dtype="float32")
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    unusual_norms_and_biases_(model)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def rm_node(model_path: str, **rollout):
    """The yaml's typed `reward.reward_model` section, enabled on `model_path`, with `rollout` keys set."""
    from megarl.config.read import to_typed
    from megarl.config.schema.reward import RewardModelConfig

    node = OmegaConf.load(Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml").reward.reward_model
    node.enable, node.model_path = True, model_path
    for key, value in {"dtype": "float32", **rollout}.items():
        node.rollout[key] = value
    return to_typed(RewardModelConfig, OmegaConf.to_container(node, resolve=True), "reward.reward_model.")


def rows_batch(seed: int = 3, n: int = 8) -> dict[str, torch.Tensor]:
    """`n` right-padded rows of 3..12 random tokens (ids < PAD)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 13, (n,), generator=gen)
    mask = (torch.arange(12) < lengths[:, None]).long()
    ids = torch.randint(0, PAD, mask.shape, generator=gen) * mask
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def hf_scores(model_path: str, batch: dict) -> torch.Tensor:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return torch.stack([model(input_ids=ids[m.bool()][None]).logits[0, 0]
                            for ids, m in zip(batch["input_ids"], batch["attention_mask"])])


def _score(model_paths: list[str], batch: dict, rollout: dict) -> dict:
    """Rank body: each model's scores; whether its weights were offloaded after init and after scoring."""
    from megarl.protocol import DataProto
    from megarl.workers.reward_model import RewardModelWorker

    out = {}
    for path in model_paths:
        worker = RewardModelWorker(rm_node(path, **rollout), device="cpu")
        worker.init_model()
        weight = next(worker.engine.unwrapped_chunks()[0].parameters())
        offloaded_after_init = weight.untyped_storage().size() == 0
        scores = worker.compute_rm_score(DataProto.from_dict(dict(batch))).batch["rm_scores"]
        out[path] = {"scores": scores, "offloaded": (offloaded_after_init, weight.untyped_storage().size() == 0)}
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_models")
    return [make_tiny_reward_model(str(root / family), family) for family in ("qwen2", "llama")]


def _check(results: list[dict], models: list[str], batch: dict, offloaded: tuple[bool, bool]) -> None:
    for path in models:
        want = hf_scores(path, batch)
        assert want.std() > 0.1  # the scores differ between rows: a wrong token position shows
        for rank_out in results:  # every rank returns the same, full result
            torch.testing.assert_close(rank_out[path]["scores"], want, atol=1e-5, rtol=1e-5)
            assert rank_out[path]["offloaded"] == offloaded


def test_scores_equal_hf_at_tp2_in_micro_batches_with_offload(models):
    """TP=2, micro-batches of 3 rows, weights in host memory between calls (free_cache_engine)."""
    batch = rows_batch()
    rollout = {"tensor_model_parallel_size": 2, "max_num_seqs": 3, "free_cache_engine": True}
    _check(run_distributed(_score, 2, models, batch, rollout, timeout=300), models, batch, (True, True))


@pytest.mark.extended
def test_scores_equal_hf_at_tp1_without_offload(models):
    """TP=1 in one micro-batch, weights kept on the device (free_cache_engine=false)."""
    batch = rows_batch()
    rollout = {"tensor_model_parallel_size": 1, "max_num_seqs": 1024, "free_cache_engine": False}
    _check(run_distributed(_score, 1, models, batch, rollout, timeout=300), models, batch, (False, False))
