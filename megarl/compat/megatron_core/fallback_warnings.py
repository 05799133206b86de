"""Megatron-Core's import-time "Transformer Engine and Apex are not installed" warnings.

megatron-core warns, once in each module that would use them, that it falls back to
torch implementations when transformer-engine and apex are missing: six UserWarnings in the
driver and six more in every worker, as each one imports megatron. On CPU these packages
cannot run at all, and megarl's CPU path is built on exactly those fallbacks (torch norms,
optimizer and grad clipping; tested against HF transformers), so the lines carry no news.

``megarl/__init__.py`` calls :func:`ignore_fallback_warnings` in every process before any
megarl module imports megatron; the filter matches only these two messages and only when
raised from megatron modules. The driver prints :func:`fallback_note` once instead. Light on
purpose (no torch, no megatron): every megarl process imports it.
"""

from __future__ import annotations

import importlib.util
import warnings

from megarl.compat.shim import Shim

__all__ = ["SHIMS", "FALLBACK_MESSAGE", "fallback_note", "ignore_fallback_warnings"]

FALLBACK_MESSAGE = r"(Transformer Engine and Apex are|Apex is) not installed\. Falling back"
PACKAGES = ("transformer_engine", "apex")


def _still_warns() -> bool:
    import inspect

    from megatron.core import optimizer
    from megatron.core.models import backends

    return all("not installed. Falling back" in inspect.getsource(m) for m in (optimizer, backends))


SHIMS = (
    Shim("warnings filter: megatron's TE/apex fallback warnings", ("megatron-core==0.19.2",), ("cpu", "gpu"),
         "optimizer/__init__.py:25 'Transformer Engine and Apex are not installed. Falling back to Torch "
         "optimizers.' and models/backends.py:21 (and the layer-spec modules) 'Apex is not installed. Falling "
         "back to Torch Norm', once per importing process", _still_warns),
)


def ignore_fallback_warnings() -> None:
    """Filter megatron's fallback warnings in this process (a warnings filter; idempotent)."""
    warnings.filterwarnings("ignore", message=FALLBACK_MESSAGE, category=UserWarning, module=r"megatron\.")


def fallback_note() -> str | None:
    """One line saying which of the packages are missing; None when both are installed."""
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"[megarl] {' and '.join(missing)} not installed: Megatron-Core uses its torch fallbacks "
            "(norms, optimizer, grad clipping); its import-time warnings about this are hidden")
