"""The GPU stack megarl ships: which Python modules the cluster's GPU nodes can import.

A plan for ``trainer.device=cuda`` made on a machine without a GPU (a login node) judges the
settings that need GPU packages (Transformer Engine's fused RoPE / MoE permutation / FP8, its
FusedAdam, flash-attn, apex) against this stack instead of the local packages:
``requirements/gpu-lock.txt`` (the Dockerfile's gpu target installs under it), or, where megarl
is installed without the repository, the ``gpu`` extra's requirements.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

__all__ = ["GPU_LOCK", "in_gpu_stack", "shipped_distributions"]

GPU_LOCK = Path(__file__).resolve().parents[2] / "requirements" / "gpu-lock.txt"
DISTRIBUTION_OF = {"fused_weight_gradient_mlp_cuda": "apex", "fla": "flash-linear-attention"}  # import names unlike
# their distribution's


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def shipped_distributions(lock: Path = GPU_LOCK) -> frozenset[str]:
    """Canonical names of the distributions pinned in ``lock``; without the file, those the
    ``gpu`` extra of the installed megarl requires."""
    if lock.is_file():
        lines = lock.read_text().splitlines()
    else:
        try:
            lines = [r.split(";")[0] for r in requires("megarl") or [] if 'extra == "gpu"' in r]
        except PackageNotFoundError:
            lines = []
    names = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#")[0]) for line in lines)
    return frozenset(_canonical(m.group(1)) for m in names if m)


def in_gpu_stack(module: str) -> bool:
    """Whether the shipped GPU stack has importable ``module`` (its top-level package)."""
    top = module.split(".")[0]
    return _canonical(DISTRIBUTION_OF.get(top, top)) in shipped_distributions()
