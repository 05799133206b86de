"""The embedded demo: deterministic assets, loadable by transformers, built only where asked."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from megarl.data.demo import MODEL_STAMP, MODEL_VERSION, TRAIN_ROWS, VAL_ROWS, demo_dir, ensure_demo_assets, model_stamp
from megarl.data.demo_data import (
    DATA_VERSION,
    PROBLEMS,
    VERSION_KEY,
    data_version,
    generate_rows,
    make_prompt_text,
    write_rows_parquet,
)
from megarl.reward.demo_task import DATA_SOURCE, compute_score


def demo_cfg(root: Path) -> dict:
    return {
        "data": {"train_files": str(root / "train.parquet"), "val_files": [str(root / "val.parquet")]},
        "actor_rollout_ref": {"model": {"path": str(root / "model")}},
    }


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(demo_dir, tmp_path_factory):
    """The demo assets built twice, in two fresh demo dirs: the session's (tests/conftest.py) and one here."""
    root = tmp_path_factory.mktemp("b")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEGARL_DEMO_DIR", str(root))
        ensure_demo_assets(demo_cfg(root))
    return [demo_dir, root]


def test_demo_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path / "x"))
    assert demo_dir() == (tmp_path / "x").resolve()
    monkeypatch.delenv("MEGARL_DEMO_DIR")
    assert demo_dir() == (Path.home() / ".cache/megarl/demo").resolve()


def test_assets_are_deterministic(built):
    a, b = built
    for name in ("train.parquet", "val.parquet", "model/model.safetensors", "model/tokenizer.json", "model/config.json"):
        assert digest(a / name) == digest(b / name), name


def test_rows_follow_the_task_definition(built):
    train = pq.read_table(built[0] / "train.parquet").to_pylist()
    val = pq.read_table(built[0] / "val.parquet").to_pylist()
    assert len(train) == TRAIN_ROWS and len(val) == VAL_ROWS == 200
    for split, rows in (("train", train), ("val", val)):
        for i, r in enumerate(rows):
            assert r["data_source"] == DATA_SOURCE and r["reward_model"]["style"] == "rule"
            assert r["extra_info"] == {"split": split, "index": i}
            (message,) = r["prompt"]
            assert message["role"] == "user"
            a, op, b, equals = message["content"].split(" ")
            assert a in "0123456789" and b in "0123456789" and op in "+-" and equals == "="
            assert r["reward_model"]["ground_truth"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
    assert sorted(r["prompt"][0]["content"] for r in val) == sorted(make_prompt_text(*p) for p in PROBLEMS)
    answers = [r["reward_model"]["ground_truth"] for r in val]
    # every answer 0..9 is right for 11 problems, any other for fewer: best constant 11/200
    assert max(answers.count(x) for x in set(answers)) == 11 == answers.count("0") == answers.count("9")
    ops = [r["prompt"][0]["content"].split(" ")[1] for r in train]
    assert 0.45 < ops.count("+") / len(ops) < 0.55


def test_generate_rows_depends_on_seed_and_split():
    assert generate_rows("train", 8, 0) == generate_rows("train", 8, 0)
    assert generate_rows("train", 8, 0) != generate_rows("train", 8, 1)
    assert generate_rows("train", 8, 0) != generate_rows("val", 8, 0)
    with pytest.raises(ValueError, match="demo split"):
        generate_rows("test", 1, 0)
    with pytest.raises(ValueError, match="at most 200 rows"):
        generate_rows("val", 201, 0)


def test_tokenizer_loads_and_round_trips_task_text(built):
    tokenizer = AutoTokenizer.from_pretrained(built[0] / "model")
    assert len(tokenizer) == 64
    text = make_prompt_text(7, "-", 9)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(ids) == ["7", "Ġ-", "Ġ", "9", "Ġ="]
    chat = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered == f"<|user|>{text}<|assistant|>"
    assert len(tokenizer(rendered, add_special_tokens=False)["input_ids"]) == 7  # the yaml's max_prompt_length is 8
    # answers: the minus sign and every digit are one token each
    assert tokenizer.convert_ids_to_tokens(tokenizer("-2", add_special_tokens=False)["input_ids"]) == ["-", "2"]
    assert tokenizer.convert_ids_to_tokens(tokenizer("13", add_special_tokens=False)["input_ids"]) == ["1", "3"]
    # a response as the rollout decodes it: answer tokens, then eos/pad (skipped)
    response = tokenizer.convert_tokens_to_ids(["-", "2", "<eos>", "<pad>"])
    decoded = tokenizer.decode(response, skip_special_tokens=True)
    assert decoded == "-2" and compute_score(decoded, "-2") == 1.0


def test_model_has_the_specified_shape_and_loads(built):
    model = AutoModelForCausalLM.from_pretrained(built[0] / "model", dtype=torch.float32)
    c = model.config
    assert (c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers) == ("qwen2", 64, 128, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (4, 2, 32, 256)
    assert c.max_position_embeddings == 128 and c.tie_word_embeddings is False
    assert model.lm_head.weight.dtype == torch.float32
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    tokenizer = AutoTokenizer.from_pretrained(built[0] / "model")
    assert (c.eos_token_id, c.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    logits = model(torch.tensor([[4, 5, 6]])).logits
    assert logits.shape == (1, 3, 64) and torch.isfinite(logits).all()
    assert model_stamp(built[0] / "model") == {"data_version": DATA_VERSION, "model_version": MODEL_VERSION}


def stamped_model_dir(root: Path, stamp: dict | None) -> Path:
    """A fake demo model dir: a marker file and, unless None, ``stamp`` as its version stamp."""
    (root / "model").mkdir()
    (root / "model" / "mine").write_text("x")
    if stamp is not None:
        (root / "model" / MODEL_STAMP).write_text(json.dumps(stamp))
    return root / "model"


def test_existing_assets_are_not_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    write_rows_parquet(generate_rows("train", 3, 7), tmp_path / "train.parquet")  # current version, other rows
    stamped_model_dir(tmp_path, {"data_version": DATA_VERSION, "model_version": MODEL_VERSION})
    cfg = {"data": {"train_files": str(tmp_path / "train.parquet")}, "actor_rollout_ref": {"model": {"path": str(tmp_path / "model")}}}
    assert ensure_demo_assets(cfg) == [tmp_path / "model", tmp_path / "train.parquet"]
    assert pq.read_table(tmp_path / "train.parquet").to_pylist() == generate_rows("train", 3, 7)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [MODEL_STAMP, "mine"]


@pytest.mark.parametrize("stamp", [None, {"data_version": DATA_VERSION, "model_version": MODEL_VERSION - 1}],
                         ids=["unstamped (random-init model of older megarl)", "older model version"])
def test_a_model_of_another_version_is_rebuilt(tmp_path, monkeypatch, stamp):
    """The stale dir is replaced as a whole (the builder is faked: the real one is tested above)."""
    import megarl.data.demo as demo

    def fake_build(target: Path) -> None:
        (target / "new").write_text("y")
        (target / MODEL_STAMP).write_text(json.dumps({"data_version": DATA_VERSION, "model_version": MODEL_VERSION}))

    monkeypatch.setitem(demo.BUILDERS, demo.MODEL_NAME, fake_build)
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    model_dir = stamped_model_dir(tmp_path, stamp)
    assert ensure_demo_assets({"actor_rollout_ref": {"model": {"path": str(model_dir)}}}) == [model_dir]
    assert sorted(p.name for p in model_dir.iterdir()) == [MODEL_STAMP, "new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no stale or temporary dir left


def test_a_split_of_another_data_version_is_rebuilt(tmp_path, monkeypatch):
    """A cache from an older megarl (unstamped 5-digit rows, version 1) or a stray file in
    the demo dir is replaced by the current split, not silently reused."""
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    old = [{**r, "prompt": [{"role": "user", "content": "largest digit : 1 2 3 4 5"}]} for r in generate_rows("val", 4, 0)]
    pq.write_table(pa.Table.from_pylist(old), str(tmp_path / "val.parquet"))  # no version stamp
    (tmp_path / "train.parquet").write_bytes(b"not parquet")
    v1 = pa.Table.from_pylist(old).replace_schema_metadata({VERSION_KEY: b"1"})
    pq.write_table(v1, str(tmp_path / "other.parquet"))
    assert data_version(tmp_path / "val.parquet") is None and data_version(tmp_path / "train.parquet") is None
    assert data_version(tmp_path / "other.parquet") == 1 != DATA_VERSION
    cfg = {"data": {"train_files": str(tmp_path / "train.parquet"), "val_files": str(tmp_path / "val.parquet")}}
    ensure_demo_assets(cfg)
    assert pq.read_table(tmp_path / "val.parquet").to_pylist() == generate_rows("val", VAL_ROWS, 0)
    assert pq.read_table(tmp_path / "train.parquet").num_rows == TRAIN_ROWS
    assert data_version(tmp_path / "val.parquet") == data_version(tmp_path / "train.parquet") == DATA_VERSION
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.parquet", "train.parquet", "val.parquet"]


def test_paths_outside_the_demo_dir_are_never_touched(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path / "demo"))
    user_file = tmp_path / "user" / "train.parquet"
    assert ensure_demo_assets({"data": {"train_files": [str(user_file)], "val_files": None}}) == []
    assert not user_file.exists() and not (tmp_path / "demo").exists()


def test_unknown_path_in_demo_dir_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.path=.*model2.*not a demo asset"):
        ensure_demo_assets({"actor_rollout_ref": {"model": {"path": str(tmp_path / "model2")}}})


BUILD = """
import sys
from megarl.data.demo import ensure_demo_assets
root = sys.argv[1]
ensure_demo_assets({"data": {"train_files": root + "/train.parquet"}, "actor_rollout_ref": {"model": {"path": root + "/model"}}})
"""


@pytest.mark.slow
def test_two_processes_building_at_once(tmp_path, built):
    env = {"MEGARL_DEMO_DIR": str(tmp_path), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path)], env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "train.parquet"]  # no temp dirs left
    for name in ("train.parquet", "model/model.safetensors", "model/tokenizer.json"):
        assert digest(tmp_path / name) == digest(built[0] / name)


def test_accepts_an_omegaconf_config(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setenv("MEGARL_DEMO_DIR", str(tmp_path))
    cfg = OmegaConf.create({"data": {"train_files": [str(tmp_path / "val.parquet")], "val_files": None}})
    assert ensure_demo_assets(cfg) == [tmp_path / "val.parquet"]
    assert pq.read_table(tmp_path / "val.parquet").num_rows == VAL_ROWS
