"""The declaration every version shim makes (no imports of the dependencies themselves)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable

__all__ = ["Shim", "STACKS", "source_has"]

STACKS = ("cpu", "gpu")  # CI's stack (requirements/cpu-constraints.txt) and the GPU machine's (gpu-lock.txt)


@dataclasses.dataclass(frozen=True)
class Shim:
    """One patch of a dependency's behaviour.

    Attributes:
        name: what is patched, e.g. ``"torch.cuda.current_device"``.
        checked: the exact pins it was checked against, e.g. ``("megatron-core==0.19.2",)``; every pin
            of those distributions in ``stacks`` must be one of them, and each of them pinned there.
        stacks: where it applies (:data:`STACKS`).
        why: the upstream behaviour it works around (file and line of the checked version).
        still_needed: a cheap check, on the installed dependency, that the upstream behaviour is still
            there (e.g. a call in a function's source); None when only a behaviour test can tell.
    """

    name: str
    checked: tuple[str, ...]
    stacks: tuple[str, ...]
    why: str
    still_needed: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.stacks) - set(STACKS)
        if unknown or not self.stacks:
            raise ValueError(f"shim {self.name}: stacks must be among {STACKS}, got {self.stacks}")
        if not self.checked or any("==" not in pin for pin in self.checked):
            raise ValueError(f"shim {self.name}: checked must be exact pins 'name==version', got {self.checked}")


def source_has(module: str, attribute: str | None, text: str) -> Callable[[], bool]:
    """A :attr:`Shim.still_needed` check: ``text`` occurs in the source of ``module.attribute``
    (of the module itself when ``attribute`` is None; a wrapped function is unwrapped)."""

    def check() -> bool:
        obj = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            obj = getattr(obj, part)
        return text in inspect.getsource(inspect.unwrap(obj))

    return check
