"""Offload buffers are page-locked and exactly their size (torch's pinned allocator rounds every
block up to a power of two: it nearly doubled a 7B actor's host memory). Needs CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_pinned_offload_buffer_is_exact_and_page_locked():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from megarl.compat.pinned_memory import exact_pinned

    nbytes = 3 * 2**20 + 5  # not a power of two
    storage = exact_pinned(nbytes)
    assert storage.nbytes() == nbytes
    host = torch.empty(0, dtype=torch.uint8).set_(storage)
    assert host.is_pinned()
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    host.copy_(source)
    assert torch.equal(host.cuda(), source)
