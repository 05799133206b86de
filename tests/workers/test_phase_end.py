"""colocate_async's common end of a generation phase (megarl.workers.phase_end), counted in a real
TCPStore as the world's rank 0 serves it: no replica's test passes before the last one arrived, and
each phase counts afresh."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from megarl.workers import phase_end
from megarl.workers.phase_end import PhaseEnd


@pytest.fixture
def world_store(monkeypatch):
    """A TCPStore served as the world's rank 0 serves it, at MASTER_ADDR:MASTER_PORT."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    return master


def test_the_phase_ends_when_the_last_replica_arrives(world_store, monkeypatch):
    monkeypatch.setattr(phase_end, "POLL_S", 0.0)
    a, b, c = (PhaseEnd(3) for _ in range(3))

    done_a = a.arrive()
    assert not done_a()
    done_b = b.arrive()
    assert not done_a() and not done_b()
    done_c = c.arrive()
    assert done_c() and done_a() and done_b()

    again_b = b.arrive()  # the next phase: the count starts again
    assert not again_b()
    again_a, again_c = a.arrive(), c.arrive()
    assert again_a() and again_b() and again_c()


def test_the_store_is_read_at_most_once_per_poll_interval(world_store, monkeypatch):
    monkeypatch.setattr(phase_end, "POLL_S", 3600.0)
    a, b = PhaseEnd(2), PhaseEnd(2)
    done_a = a.arrive()
    b.arrive()
    assert not done_a()  # b has arrived, but a reads the store again only after POLL_S
    monkeypatch.setattr(phase_end, "POLL_S", 0.0)
    assert done_a()
