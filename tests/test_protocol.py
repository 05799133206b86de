"""DataProto against hand-built expectations."""

import pickle

import numpy as np
import pytest
import torch

from megarl.protocol import DataProto, DataProtoItem


def make(n: int = 4, meta=None) -> DataProto:
    """Row i has ids [10i, 10i+1], score i/2, name f"r{i}", chat [i] (a list: must stay whole)."""
    return DataProto.from_dict(
        {
            "ids": torch.tensor([[10 * i, 10 * i + 1] for i in range(n)]),
            "score": torch.arange(n, dtype=torch.float32) / 2,
        },
        {"name": [f"r{i}" for i in range(n)], "chat": [[i] for i in range(n)]},
        meta if meta is not None else {"temperature": 1.0},
    )


def rows(data: DataProto) -> list[str]:
    return list(data.non_tensor_batch["name"])


def test_from_dict_builds_1d_object_arrays_and_checks_lengths():
    data = make(3)
    assert len(data) == 3
    assert data.non_tensor_batch["chat"].shape == (3,)  # not (3, 1)
    assert data.non_tensor_batch["chat"][2] == [2]
    with pytest.raises(ValueError, match="'b'.*batch size 2"):
        DataProto.from_dict({"a": torch.zeros(2, 1), "b": torch.zeros(3, 1)})
    with pytest.raises(ValueError, match="non-tensor 'names' has length 3, batch size is 2"):
        DataProto.from_dict({"a": torch.zeros(2, 1)}, {"names": ["x", "y", "z"]})


def test_only_non_tensors_is_allowed():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    assert len(data) == 2
    assert list(data[1:].non_tensor_batch["uid"]) == ["b"]
    assert list(DataProto.concat([data, data]).non_tensor_batch["uid"]) == ["a", "b", "a", "b"]


def test_getitem_int_slice_tensor_bool():
    data = make(4)
    item = data[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [20, 21]
    assert item.non_tensor_batch["name"] == "r2" and item.non_tensor_batch["chat"] == [2]
    assert rows(data[1:3]) == ["r1", "r2"]
    assert data[1:3].batch["ids"].tolist() == [[10, 11], [20, 21]]
    picked = data[torch.tensor([3, 0])]
    assert rows(picked) == ["r3", "r0"] and picked.batch["score"].tolist() == [1.5, 0.0]
    masked = data[torch.tensor([True, False, False, True])]
    assert rows(masked) == ["r0", "r3"]
    assert rows(data[np.array([1])]) == ["r1"]
    assert data[-1].non_tensor_batch["name"] == "r3"
    with pytest.raises(IndexError):
        data[4]


def test_chunk_split_concat_round_trip():
    data = make(6, meta={"temperature": 0.7})
    parts = data.chunk(3)
    assert [rows(p) for p in parts] == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"]]
    assert all(p.meta_info == {"temperature": 0.7} for p in parts)
    with pytest.raises(ValueError, match="6 is not divisible by 4"):
        data.chunk(4)
    split = data.split(4)
    assert [rows(p) for p in split] == [["r0", "r1", "r2", "r3"], ["r4", "r5"]]
    joined = DataProto.concat(split)
    assert rows(joined) == rows(data)
    assert torch.equal(joined.batch["ids"], data.batch["ids"])
    assert joined.meta_info == {"temperature": 0.7}


def test_concat_meta_info_conflicts_and_metrics():
    a, b = make(2, meta={"step": 1, "metrics": {"loss": 1.0}}), make(2, meta={"step": 1, "metrics": {"loss": 2.0}})
    joined = DataProto.concat([a, b])
    assert joined.meta_info == {"step": 1, "metrics": [{"loss": 1.0}, {"loss": 2.0}]}
    with pytest.raises(ValueError, match="meta_info 'step'"):
        DataProto.concat([make(2, meta={"step": 1}), make(2, meta={"step": 2})])
    with pytest.raises(ValueError, match="part 1 has keys"):
        DataProto.concat([make(2), make(2).select(batch_keys=["ids"])])


def test_repeat_interleave_and_tile():
    data = make(2)
    assert rows(data.repeat(3)) == ["r0", "r0", "r0", "r1", "r1", "r1"]
    assert rows(data.repeat(2, interleave=False)) == ["r0", "r1", "r0", "r1"]
    assert data.repeat(2).batch["ids"][:, 0].tolist() == [0, 0, 10, 10]


def test_reorder_in_place():
    data = make(3)
    out = data.reorder(torch.tensor([2, 0, 1]))
    assert out is data
    assert rows(data) == ["r2", "r0", "r1"]
    assert data.batch["ids"][:, 0].tolist() == [20, 0, 10]


def test_select_and_pop():
    data = make(2, meta={"a": 1, "b": 2})
    sel = data.select(batch_keys=["ids"], non_tensor_batch_keys=["name"], meta_info_keys=["b"])
    assert list(sel.batch.keys()) == ["ids"] and list(sel.non_tensor_batch) == ["name"] and sel.meta_info == {"b": 2}
    assert set(data.select().batch.keys()) == {"ids", "score"}
    with pytest.raises(KeyError, match="'nope'"):
        data.select(batch_keys=["nope"])
    popped = data.pop(batch_keys=["score"])
    assert list(popped.batch.keys()) == ["score"] and list(data.batch.keys()) == ["ids"]


def test_union_merges_and_rejects_conflicts():
    base = make(2)
    extra = DataProto.from_dict({"values": torch.tensor([[1.0], [2.0]]), "ids": base.batch["ids"].clone()},
                                {"name": ["r0", "r1"]}, {"temperature": 1.0, "step": 5})
    merged = base.union(extra)
    assert set(merged.batch.keys()) == {"ids", "score", "values"}
    assert merged.meta_info == {"temperature": 1.0, "step": 5}
    with pytest.raises(ValueError, match="tensor 'ids' differs"):
        make(2).union(DataProto.from_dict({"ids": torch.zeros(2, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match="non-tensor 'name' differs"):
        make(2).union(DataProto.from_dict(non_tensors={"name": ["x", "y"]}))
    with pytest.raises(ValueError, match="meta_info 'temperature' differs"):
        make(2).union(DataProto.from_dict(non_tensors={"z": [1, 2]}, meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match="lengths differ"):
        make(2).union(make(3))


def test_pad_to_divisor_repeats_leading_rows_and_unpads():
    data = make(5)
    padded, pad = data.pad_to_divisor(4)
    assert pad == 3 and rows(padded) == ["r0", "r1", "r2", "r3", "r4", "r0", "r1", "r2"]
    assert rows(padded.unpad(pad)) == rows(data)
    same, zero = data.pad_to_divisor(5)
    assert zero == 0 and same is data
    # pad larger than the batch cycles through it
    small, pad = make(2).pad_to_divisor(7)
    assert pad == 5 and rows(small) == ["r0", "r1", "r0", "r1", "r0", "r1", "r0"]


def test_pickle_round_trip_and_chunk_costs_its_own_bytes():
    data = DataProto.from_dict({"x": torch.randn(64, 1024)}, {"uid": [str(i) for i in range(64)]}, {"k": 1})
    back = pickle.loads(pickle.dumps(data))
    assert torch.equal(back.batch["x"], data.batch["x"]) and list(back.non_tensor_batch["uid"]) == list(
        data.non_tensor_batch["uid"]
    ) and back.meta_info == {"k": 1}
    chunk_bytes = 8 * 1024 * 4  # one 8-row chunk of float32
    part = data.chunk(8)[3]
    size = len(pickle.dumps(part))
    assert chunk_bytes <= size < chunk_bytes + 4096, size  # not the whole 256 KiB storage
    assert torch.equal(pickle.loads(pickle.dumps(part)).batch["x"], data.batch["x"][24:32])
