"""verl's data keys megarl implements, each against an independent reference:

- data.train_max_samples / data.val_max_samples: verl's row-selection rule (first N, or with
  data.shuffle the rows numpy's seeded `choice` draws), before the overlong filter;
- data.validation_shuffle: torch's seeded permutation, a new one each validation pass;
- data.apply_chat_template_kwargs: token ids derived by hand from the template;
- actor_rollout_ref.model.custom_chat_template: the same, through the tokenizer the
  preflight (and the trainer) load;
- data.trust_remote_code: a marker file the tokenizer's custom code writes when it runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import data_config, row
from megarl.config import ConfigError, collect_issues, load_config, typed_config
from megarl.data import DataError, RLDataset, create_dataloader, create_dataset
from megarl.data.demo_tokenizer import CHAT_TEMPLATE

DIGITS = "0123456789"


def contents(dataset) -> list[str]:
    return [r["prompt"][0]["content"] for r in dataset.rows]


def order(loader) -> list[list[int]]:
    return [[e["index"] for e in b.non_tensor_batch["extra_info"]] for b in loader]


def ids(tokenizer, *tokens: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(tokens))


@pytest.fixture
def files(write_rows):
    """train: contents "0".."9"; val: two files, "a0".."a2" then "b0".."b3" (7 rows)."""
    train = write_rows([row(str(i), i) for i in range(10)], "train.parquet")
    val = [write_rows([row(f"{i}", i) for i in range(3)], "va.parquet"),
           write_rows([row(f"{i}{i}", 3 + i) for i in range(4)], "vb.parquet")]
    return {"train_files": train, "val_files": val, "max_prompt_length": 8, "train_batch_size": 2}


# ------------------------------------------------------------------ max_samples
def test_max_samples_keeps_the_first_rows_without_shuffle(files, tokenizer):
    cfg = data_config(**files, train_max_samples=4, val_max_samples=5, shuffle=False)
    assert contents(create_dataset(cfg, tokenizer, "train")) == ["0", "1", "2", "3"]
    assert contents(create_dataset(cfg, tokenizer, "val")) == ["0", "1", "2", "00", "11"]  # across both files
    everything = data_config(**files, shuffle=False)  # -1: every row
    assert len(create_dataset(everything, tokenizer, "train")) == 10 and len(create_dataset(everything, tokenizer, "val")) == 7


@pytest.mark.parametrize("seed", [3, 11])
def test_max_samples_with_shuffle_picks_the_rows_verl_picks(files, tokenizer, seed):
    # verl 0.9.1, verl/utils/dataset/rl_dataset.py (RLHFDataset._read_files_and_tokenize), with data.shuffle:
    #   rng = np.random.default_rng(seed); indices = rng.choice(total, size=max_samples, replace=False)
    #   dataframe = dataframe.select(indices.tolist())
    val_rows = ["0", "1", "2", "00", "11", "22", "33"]
    expected = [val_rows[i] for i in np.random.default_rng(seed).choice(7, size=4, replace=False).tolist()]
    cfg = data_config(**files, val_max_samples=4, shuffle=True, seed=seed)
    assert contents(create_dataset(cfg, tokenizer, "val")) == expected
    assert len(create_dataset(cfg, tokenizer, "train")) == 10  # train_max_samples=-1: the other split keeps all


@pytest.mark.parametrize("max_samples", [-1, 0, 10, 50])
def test_max_samples_not_below_the_row_count_keeps_every_row(files, tokenizer, max_samples):
    cfg = data_config(**files, train_max_samples=max_samples, shuffle=True, seed=3)
    assert contents(create_dataset(cfg, tokenizer, "train")) == [str(i) for i in range(10)]


def test_max_samples_is_taken_before_the_overlong_filter(write_rows, tokenizer):
    # as in verl: N rows are picked, then the filter drops the long ones (12 tokens > 8)
    path = write_rows([row("1", 0), row(DIGITS, 1), row("2", 2), row("3", 3)])
    cfg = data_config(train_files=path, max_prompt_length=8, filter_overlong_prompts=True, shuffle=False, train_max_samples=3)
    assert contents(create_dataset(cfg, tokenizer, "train")) == ["1", "2"]


def test_train_batch_size_above_the_kept_rows_names_max_samples(files, tokenizer):
    cfg = data_config(**{**files, "train_batch_size": 5}, train_max_samples=4)
    with pytest.raises(DataError, match=r"exceeds the 4 training prompts \(data.train_max_samples=4\)"):
        create_dataloader(cfg, tokenizer, "train")


CUSTOM = '''
from megarl.data import RLDataset

class Recording(RLDataset):
    def __init__(self, data_files, tokenizer, config, max_samples=-1):
        super().__init__(data_files, tokenizer, config, max_samples=max_samples)
        self.max_samples_given = max_samples

class Old(RLDataset):
    def __init__(self, data_files, tokenizer, config):
        super().__init__(data_files, tokenizer, config)
'''


def test_a_custom_dataset_class_gets_max_samples_as_in_verl(files, tokenizer, tmp_path):
    (tmp_path / "custom.py").write_text(CUSTOM)
    cfg = data_config(**files, custom_cls={"path": str(tmp_path / "custom.py"), "name": "Recording"},
                      train_max_samples=3, shuffle=False)
    dataset = create_dataset(cfg, tokenizer, "train")
    assert dataset.max_samples_given == 3 and contents(dataset) == ["0", "1", "2"]
    assert create_dataset(cfg, tokenizer, "val").max_samples_given == -1  # not set for val: not passed
    old = data_config(**files, custom_cls={"path": str(tmp_path / "custom.py"), "name": "Old"}, train_max_samples=3)
    with pytest.raises(DataError, match=r"max_samples=N \(data.train_max_samples is set\)"):
        create_dataset(old, tokenizer, "train")


# ------------------------------------------------------------------ validation_shuffle
def test_validation_shuffle_is_a_seeded_new_order_each_pass(files, tokenizer):
    file_order = [[0, 1, 2, 3, 4, 5, 6]]
    plain = create_dataloader(data_config(**files, shuffle=True, seed=4), tokenizer, "val")
    assert order(plain) == file_order and order(plain) == file_order  # data.shuffle is the training set's

    loader = create_dataloader(data_config(**files, validation_shuffle=True, seed=4), tokenizer, "val")
    first, second = order(loader), order(loader)
    reference = [torch.randperm(7, generator=torch.Generator().manual_seed(4 + k)).tolist() for k in (0, 1)]
    assert first == [reference[0]] and second == [reference[1]] and reference[0] != file_order[0]

    batched = create_dataloader(data_config(**files, validation_shuffle=True, seed=4, val_batch_size=3), tokenizer, "val")
    assert order(batched) == [reference[0][:3], reference[0][3:6], reference[0][6:]]  # the short batch is kept


# ------------------------------------------------------------------ apply_chat_template_kwargs
# The demo template plus a Qwen3-style switch: enable_thinking=false adds a marker after the
# generation prompt (here <|system|>, a token the demo tokenizer has).
THINKING_TEMPLATE = CHAT_TEMPLATE + (
    "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}{{ '<|system|>' }}{% endif %}"
)


@pytest.fixture
def thinking_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = THINKING_TEMPLATE
    return tok


@pytest.mark.parametrize("kwargs, extra", [({}, []), ({"enable_thinking": True}, []), ({"enable_thinking": False}, ["<|system|>"])])
def test_apply_chat_template_kwargs_reach_the_template(write_rows, thinking_tokenizer, kwargs, extra):
    path = write_rows([row("123", 0)])
    cfg = data_config(train_files=path, max_prompt_length=8, apply_chat_template_kwargs=kwargs)
    item = RLDataset([path], thinking_tokenizer, cfg)[0]
    expected = ids(thinking_tokenizer, "<|user|>", "1", "2", "3", "<|assistant|>", *extra)
    assert item["input_ids"][item["attention_mask"].bool()].tolist() == expected


def test_apply_chat_template_kwargs_may_not_set_what_megarl_sets(write_rows, tokenizer):
    cfg = data_config(train_files=write_rows([row("1", 0)]), apply_chat_template_kwargs={"tokenize": True, "enable_thinking": False})
    with pytest.raises(DataError, match=r"sets \['tokenize'\], which megarl sets itself") as info:
        create_dataset(cfg, tokenizer, "train")
    assert info.value.key == "data.apply_chat_template_kwargs"


# ------------------------------------------------------------------ through the config and preflight
CUSTOM_TEMPLATE = (
    "{% for message in messages %}{{ '<|system|>' + message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _quoted(text: str) -> str:
    """`text` as a quoted Hydra override value."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.fixture
def run_dir(tmp_path, tokenizer, write_rows):
    """A tokenizer dir (the demo tokenizer without a chat template) and gsm8k-style data files."""
    model = tmp_path / "model"
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    tok.save_pretrained(str(model))
    rows = [{**row(str(i), i), "data_source": "openai/gsm8k"} for i in range(4)]
    return {"model": model, "train": write_rows(rows, "train.parquet"), "val": write_rows(rows, "val.parquet")}


def _cfg(run_dir, *overrides: str):
    from helpers.cpu_config import CPU_SMALL

    return typed_config(load_config([
        *CPU_SMALL, f"actor_rollout_ref.model.path={run_dir['model']}", f"data.train_files={run_dir['train']}",
        f"data.val_files={run_dir['val']}", "data.train_batch_size=2", *overrides]))


def test_custom_chat_template_renders_the_prompts(run_dir):
    from megarl.preflight.run import preflight

    with pytest.raises(ConfigError, match="it has no chat template") as info:
        preflight(_cfg(run_dir))
    assert [i.key for i in info.value.issues] == ["actor_rollout_ref.model.path"]

    cfg = _cfg(run_dir, f"actor_rollout_ref.model.custom_chat_template={_quoted(CUSTOM_TEMPLATE)}")
    assert cfg.actor_rollout_ref.model.custom_chat_template == CUSTOM_TEMPLATE  # survives the command line
    tokenizer = preflight(cfg)
    batch = next(iter(create_dataloader(cfg.data, tokenizer, "val")))
    first = batch.batch["input_ids"][0][batch.batch["attention_mask"][0].bool()].tolist()
    assert first == ids(tokenizer, "<|system|>", "0", "<|assistant|>")


def test_a_broken_custom_chat_template_names_its_key(run_dir):
    from megarl.preflight.run import preflight

    with pytest.raises(ConfigError) as info:
        preflight(_cfg(run_dir, f"actor_rollout_ref.model.custom_chat_template={_quoted('{% for m in messages %}')}"))
    issue = info.value.issues[0]
    assert issue.key == "actor_rollout_ref.model.custom_chat_template" and "chat template failed" in issue.problem


def test_apply_chat_template_kwargs_from_the_command_line(run_dir):
    from megarl.preflight.run import preflight

    cfg = _cfg(run_dir, f"actor_rollout_ref.model.custom_chat_template={_quoted(THINKING_TEMPLATE)}",
               "+data.apply_chat_template_kwargs.enable_thinking=false")  # verl users add the key
    tokenizer = preflight(cfg)
    batch = next(iter(create_dataloader(cfg.data, tokenizer, "val")))
    first = batch.batch["input_ids"][0][batch.batch["attention_mask"][0].bool()].tolist()
    assert first == ids(tokenizer, "<|user|>", "0", "<|assistant|>", "<|system|>")


MARKED_TOKENIZER = '''
open({marker!r}, "w").write("ran")
from transformers import PreTrainedTokenizerFast

class MarkedTokenizer(PreTrainedTokenizerFast):
    pass
'''


@pytest.mark.parametrize("data_trust, model_trust", [(False, False), (True, False), (False, True)])
def test_trust_remote_code_runs_the_tokenizers_code(run_dir, monkeypatch, tmp_path, data_trust, model_trust):
    from megarl.preflight.run import load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    marker = tmp_path / "ran"
    model: Path = run_dir["model"]
    (model / "marked_tokenizer.py").write_text(MARKED_TOKENIZER.format(marker=str(marker)))
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.update(auto_map={"AutoTokenizer": [None, "marked_tokenizer.MarkedTokenizer"]}, tokenizer_class="MarkedTokenizer")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = _cfg(run_dir, f"data.trust_remote_code={str(data_trust).lower()}",
               f"actor_rollout_ref.model.trust_remote_code={str(model_trust).lower()}",
               f"actor_rollout_ref.model.custom_chat_template={_quoted(CHAT_TEMPLATE)}")
    tokenizer, issue = load_tokenizer(cfg)
    trusted = data_trust or model_trust
    assert marker.exists() is trusted  # the reference: the tokenizer's own code ran
    if trusted:
        assert issue is None and type(tokenizer).__name__ == "MarkedTokenizer"
    else:
        assert tokenizer is None and issue.key == "actor_rollout_ref.model.path" and "trust_remote_code" in issue.problem


def test_the_implemented_keys_validate_at_any_value(run_dir):
    """None of them is a compat 'refuse' key any more: changed values raise no issue of their own."""
    (run_dir["model"] / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 128,
        "vocab_size": 64}))
    (run_dir["model"] / "model.safetensors").touch()
    keys = ["data.train_max_samples=3", "data.val_max_samples=2", "data.validation_shuffle=true",
            "data.trust_remote_code=true", "+data.apply_chat_template_kwargs.enable_thinking=false",
            f"actor_rollout_ref.model.custom_chat_template={_quoted(CHAT_TEMPLATE)}"]
    cfg = load_config([f"actor_rollout_ref.model.path={run_dir['model']}", f"data.train_files={run_dir['train']}",
                       f"data.val_files={run_dir['val']}", *keys])
    implemented = {"data.train_max_samples", "data.val_max_samples", "data.validation_shuffle", "data.trust_remote_code",
                   "data.apply_chat_template_kwargs", "data.apply_chat_template_kwargs.enable_thinking",
                   "actor_rollout_ref.model.custom_chat_template"}
    assert [i.format() for i in collect_issues(cfg) if i.key in implemented] == []
    assert OmegaConf.select(cfg, "data.apply_chat_template_kwargs") == {"enable_thinking": False}
    critic = collect_issues(load_config([f"actor_rollout_ref.model.path={run_dir['model']}",
                                         f"critic.model.custom_chat_template={_quoted(CHAT_TEMPLATE)}"]))
    assert "critic.model.custom_chat_template" in [i.key for i in critic]  # the critic has none of its own
