"""Megatron-Bridge (``megatron.bridge``, installed ``--no-deps``) without transformer-engine.

``import megatron.bridge`` imports every model bridge, and one module on that path,
``megatron/bridge/peft/lora_layers.py:20``, does ``import transformer_engine.pytorch as te`` unguarded
(it uses ``te`` only in its fused-LoRA paths and their annotations). Where TE is absent (CPU CI),
:func:`auto_bridge` imports the bridge with that one line of that one module bound to a stand-in
(:data:`TE_ABSENT`: classes no object is an instance of, that raise when called), through an import
hook that exists only for the length of the import. Nothing is put in ``sys.modules`` under
``transformer_engine``: megatron-core's, the bridge's own (``try: import transformer_engine``) and
megarl's TE detection all still find TE absent.

Its Requires-Dist (``megatron-core[dev,mlm]``, ``transformers<=5.12.1``, flashinfer, diffusers, ...) is not
installed: what its conversion code imports is already in megarl's stack (megatron-core 0.19's wheel ships
``megatron.training``, which it needs).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "TE_ABSENT", "auto_bridge"]

_LORA_LAYERS = "megatron.bridge.peft.lora_layers"
_TE_IMPORT = "import transformer_engine.pytorch as te"

SHIMS = (
    Shim("megatron.bridge.peft.lora_layers without transformer-engine", ("megatron-bridge==0.6.2",), ("cpu",),
         f"peft/lora_layers.py:20 '{_TE_IMPORT}' unguarded, reached from every 'import megatron.bridge': bound "
         "to TE_ABSENT for that module only (auto_bridge)",
         lambda: _TE_IMPORT in _lora_layers_source()),
)


def _lora_layers_source() -> str:
    """lora_layers.py's text, found without importing ``megatron.bridge`` (whose __init__ would run it)."""
    import megatron

    for root in megatron.__path__:
        path = os.path.join(root, "bridge", "peft", "lora_layers.py")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise ImportError("megatron.bridge is not installed")


class _AbsentMeta(type):
    """A transformer-engine name where TE is absent: attributes are more such classes, calls raise."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise ImportError(f"{cls.__qualname__} needs transformer-engine, which is not installed")


@functools.cache
def _absent(name: str) -> type:
    return _AbsentMeta(name, (), {"__qualname__": name})


TE_ABSENT = _absent("transformer_engine.pytorch")


class _LoraLayersLoader(importlib.abc.Loader):
    """Runs lora_layers.py with its TE import bound to :data:`TE_ABSENT` (no bytecode is cached)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        with open(self.origin, encoding="utf-8") as f:
            source = f.read()
        if _TE_IMPORT not in source:
            raise ImportError(f"{self.origin} no longer has '{_TE_IMPORT}': revisit megarl.compat.megatron_bridge")
        source = source.replace(_TE_IMPORT, "from megarl.compat.megatron_bridge import TE_ABSENT as te", 1)
        exec(compile(source, self.origin, "exec"), module.__dict__)


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _LORA_LAYERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_LoraLayersLoader(spec.origin))


@functools.cache
def auto_bridge():
    """``megatron.bridge.AutoBridge`` (``from_hf_pretrained(path)``, ``load_hf_weights(chunks)``,
    ``export_hf_weights(chunks, cpu=True)``), imported once; without TE through :class:`_LoraLayersFinder`."""
    if importlib.util.find_spec("transformer_engine") is not None or _LORA_LAYERS in sys.modules:
        from megatron.bridge import AutoBridge

        return AutoBridge
    finder = _LoraLayersFinder()
    sys.meta_path.insert(0, finder)
    try:
        from megatron.bridge import AutoBridge
    finally:
        sys.meta_path.remove(finder)
    return AutoBridge
