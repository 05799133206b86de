"""Plan, buckets, checksums and transports without Megatron or vLLM."""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed
from transport_body import _tensors, broadcast_stream

from megarl.weight_sync import (
    SyncStats,
    WeightSyncIntegrityError,
    build_plan,
    log_prob_gap,
    stream_in_process,
)
from megarl.weight_sync import buckets as buckets_mod
from megarl.weight_sync.integrity import words_checksum
from megarl.weight_sync.plan import ALIGN_BYTES


def _plan(tensors, size):
    return build_plan([(n, t.shape, t.dtype) for n, t in tensors.items()], bucket_size_bytes=size)


def test_plan_buckets_respect_size_alignment_and_order():
    tensors = _tensors()
    plan = _plan(tensors, 30_000)
    assert [n for b in plan.buckets for n in b.names] == list(tensors)  # export order kept
    for b in plan.buckets:
        for slot in b.slots:
            assert slot.offset % ALIGN_BYTES == 0
            assert slot.nbytes == tensors[slot.name].numel() * tensors[slot.name].element_size()
        # A bucket exceeds the size only when it is a single larger tensor.
        assert b.nbytes <= 30_000 or len(b.slots) == 1
        ends = [s.offset + s.nbytes for s in b.slots]
        assert all(e <= s.offset for e, s in zip(ends, b.slots[1:]))  # no overlap
    assert plan.slot("e")[1].nbytes == 80_000 and len(plan.slot("e")[0].slots) == 1
    assert plan.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())


def test_plan_rejects_bad_bucket_size_and_duplicates():
    with pytest.raises(ValueError, match="weight_sync.bucket_size_mb"):
        build_plan([("a", (2,), torch.float32)], bucket_size_bytes=0)
    with pytest.raises(ValueError, match="appears twice"):
        build_plan([("a", (2,), torch.float32)] * 2, bucket_size_bytes=100)


def test_in_process_stream_is_bitwise_and_bounded_by_one_bucket():
    tensors = _tensors()
    plan = _plan(tensors, 30_000)
    stats = SyncStats()
    got = {}
    for name, view in stream_in_process(iter(tensors.items()), plan, stats=stats):
        got[name] = view.clone()
        del view  # a consumer that copies (as vLLM's loaders do)
    assert all(torch.equal(got[n], tensors[n]) and got[n].dtype == tensors[n].dtype for n in tensors)
    assert stats.bytes == plan.total_bytes and stats.buckets == len(plan.buckets)
    # The loop variable of the consumer keeps the previous bucket alive at most.
    assert stats.peak_extra_bytes <= 2 * plan.max_bucket_bytes
    assert stats.peak_extra_bytes < plan.total_bytes


def test_stream_casts_to_plan_dtype():
    src = {"w": torch.randn(4, 4, dtype=torch.float32)}
    plan = build_plan([("w", (4, 4), torch.bfloat16)], bucket_size_bytes=1000)
    (name, out), = list(stream_in_process(src.items(), plan))
    assert out.dtype == torch.bfloat16 and torch.equal(out, src["w"].to(torch.bfloat16))


def test_stream_errors_name_the_tensor():
    tensors = _tensors()
    plan = _plan(tensors, 30_000)
    with pytest.raises(KeyError, match="'zzz' is not in the resharding plan"):
        list(stream_in_process(iter([("zzz", torch.zeros(1))]), plan))
    with pytest.raises(ValueError, match="'a' has shape"):
        list(stream_in_process(iter([("a", torch.zeros(3))]), plan))
    partial = [(n, t) for n, t in tensors.items() if n != "c"]
    with pytest.raises(ValueError, match=r"without 1 planned tensors: \['c'\]"):
        list(stream_in_process(iter(partial), plan))


def test_checksum_is_position_sensitive_and_matches_piecewise():
    x = torch.randn(1000)
    whole = words_checksum(x)
    # Sender side: the same bytes summed in two pieces at their byte offsets.
    half = x.numel() // 2
    assert torch.equal(words_checksum(x[:half]) + words_checksum(x[half:], byte_offset=half * 4), whole)
    # A tensor whose size is not a multiple of 4 bytes: zero-extended last word.
    odd = torch.randn(7).to(torch.bfloat16)  # 14 bytes
    buffer = torch.zeros(16, dtype=torch.uint8)
    buffer[:14] = odd.view(torch.uint8)
    assert torch.equal(words_checksum(odd), words_checksum(buffer))
    swapped = x.clone()
    swapped[[3, 7]] = swapped[[7, 3]]
    assert not torch.equal(words_checksum(swapped), whole)  # a plain sum would miss this


def test_corrupted_bucket_raises_named_error(monkeypatch):
    tensors = _tensors()
    plan = _plan(tensors, 30_000)
    real_pack = buckets_mod.pack_stream

    def corrupting(*args, **kwargs):
        for i, packed in enumerate(real_pack(*args, **kwargs)):
            if i == 1:
                packed.buffer[8] ^= 0x10  # one bit, after the sender's checksum
            yield packed

    monkeypatch.setattr("megarl.weight_sync.transport.pack_stream", corrupting)
    with pytest.raises(WeightSyncIntegrityError, match=r"bucket 1 \(") as err:
        list(stream_in_process(iter(tensors.items()), plan))
    assert err.value.names == plan.buckets[1].names
    assert "integrity_check" in str(err.value)
    # integrity_check=false: no check, the corruption goes through.
    got = dict(stream_in_process(iter(tensors.items()), plan, integrity_check=False))
    assert not torch.equal(got[plan.buckets[1].names[0]], tensors[plan.buckets[1].names[0]])


@pytest.mark.slow
def test_broadcast_transport_over_gloo():
    ok = run_distributed(broadcast_stream, 2, False, True, timeout=120)
    for res in ok:
        assert all(res["equal"].values()) and res["dtypes"]["f16"] == torch.bfloat16
        assert res["metrics"]["weight_sync/buckets"] == res["buckets"]


@pytest.mark.slow
def test_broadcast_transport_detects_corruption_on_receiver():
    bad = run_distributed(broadcast_stream, 2, True, True, timeout=120)
    assert "equal" in bad[0]  # the sender is not affected
    assert bad[1]["bucket"] == 1 and "bucket 1" in bad[1]["error"]


def test_log_prob_gap_hand_computed():
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    actor = torch.tensor([[-1.1, -2.0, -2.5], [-0.5, -0.7, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    gap = log_prob_gap(rollout, actor, mask)
    assert gap["rollout/log_prob_gap_mean"] == pytest.approx((0.1 + 0 + 0.5 + 0 + 0.2) / 5)
    assert gap["rollout/log_prob_gap_max"] == pytest.approx(0.5)
    assert log_prob_gap(rollout, actor, torch.zeros_like(mask))["rollout/log_prob_gap_max"] == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        log_prob_gap(rollout, actor[:, :2], mask)
