"""Where megarl's GPT-OSS first differs from HF's, module by module (issue 33).

Runs HF and megarl's Megatron build side by side on one device, fp32, TF32 off, on the same padded batch, and prints
for each module, in forward order, the largest difference over the valid tokens: the embedding, every layer's
attention output, router probabilities and MLP output, and the logits; then layer 0's MoE of both models on one
input against HF's formula written out in fp64 (which side is off). On CPU every row is ~1e-7.

It found the GPU's 0.0255 (2026-11-28, H200): megarl's MoE 0.0288 from the fp64 formula, HF's exact, no token routed
otherwise, in every build; the formula without the clamp gives the same 0.0288 on CPU. The GPU stack's
transformers 5.17.0 fixes GptOssExperts' limit at 7.0 and ignores the tiny model's ``swiglu_limit`` 0.1, which megarl
honours (5.19 reads it); the references now load through ``hf_tiny.hf_reference_model``.

    PYTHONPATH=/tmp/site:/tmp/site-te:$PWD python3 benchmarks/check_gpt_oss_layers.py [cuda|cpu] [local] [key=value...]

key=value: override_transformer_config entries (strings, e.g. moe_router_dtype=fp64). The probe rows run layer 0's
MoE of both models on one input against HF's formula written out in fp64 on the CPU (which side is off), and count
the tokens megarl routes to other experts than that formula.
"""

from __future__ import annotations

import sys
import tempfile

import torch

sys.path[:0] = ["tests", "tests/models"]


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _with_bias(output):
    """megatron's (out, bias) pairs: the bias is added later (bias-dropout-add); HF's output holds it."""
    if isinstance(output, tuple) and len(output) > 1 and isinstance(output[1], torch.Tensor):
        return output[0] + output[1]
    return _first(output)


def _capture(modules: dict[str, torch.nn.Module], store: dict[str, torch.Tensor], fold) -> list:
    def hook(name):
        def fn(_module, _inputs, output):
            store[name] = fold(name, output).detach().float().cpu()
        return fn
    return [m.register_forward_hook(hook(name)) for name, m in modules.items()]


def _hand_moe(x: torch.Tensor, mlp) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's GptOssMLP written out in fp64 on the CPU from its weights, limit and alpha (the config's:
    ``hf_tiny.hf_reference_model``): x [tokens, hidden] -> (output [tokens, hidden], chosen experts [tokens, k] sorted)."""
    w = {n: p.detach().double().cpu() for n, p in mlp.named_parameters()}
    x = x.double().cpu()
    top, experts = torch.topk(x @ w["router.weight"].T + w["router.bias"], mlp.router.top_k, dim=-1)
    probs = torch.softmax(top, dim=-1)
    limit, alpha = mlp.experts.limit, mlp.experts.alpha
    out = torch.zeros_like(x)
    for j in range(experts.shape[1]):
        e = experts[:, j]
        gate_up = torch.einsum("th,thi->ti", x, w["experts.gate_up_proj"][e]) + w["experts.gate_up_proj_bias"][e]
        gate, up = gate_up[:, ::2].clamp(max=limit), gate_up[:, 1::2].clamp(min=-limit, max=limit)
        act = gate * torch.sigmoid(alpha * gate) * (up + 1)
        out += probs[:, j:j + 1] * (torch.einsum("ti,tih->th", act, w["experts.down_proj"][e])
                                    + w["experts.down_proj_bias"][e])
    return out, experts.sort(dim=-1).values


def _probe_first_moe(hf, chunk, x_sbh: torch.Tensor, valid: torch.Tensor) -> list[tuple[str, float]]:
    """Layer 0's MoE of both models on one input (megarl's own, [s, b, h]) against :func:`_hand_moe`."""
    s, b, h = x_sbh.shape
    x_bsh = x_sbh.transpose(0, 1).contiguous()
    truth, experts = _hand_moe(x_bsh.reshape(-1, h), hf.model.layers[0].mlp)
    with torch.no_grad():
        hf_out = _first(hf.model.layers[0].mlp(x_bsh)).reshape(-1, h).double().cpu()
        mc_out = _with_bias(chunk.decoder.layers[0].mlp(x_sbh)).transpose(0, 1).reshape(-1, h).double().cpu()
        _, routing_map = chunk.decoder.layers[0].mlp.router(x_sbh)
    mc_experts = routing_map.reshape(s, b, -1).transpose(0, 1).reshape(s * b, -1).nonzero()[:, 1].reshape(s * b, -1)
    keep = valid.reshape(-1)
    return [("probe: HF mlp vs fp64", float((hf_out - truth)[keep].abs().max())),
            ("probe: megarl mlp vs fp64", float((mc_out - truth)[keep].abs().max())),
            ("probe: tokens routed otherwise", float((mc_experts.cpu() != experts)[keep].any(-1).sum()))]


def compare(hf_dir: str, batch, device: str, spec: str, overrides: dict) -> list[tuple[str, float]]:
    """One rank of run_distributed: (module, max |d| over valid tokens) in forward order."""
    import transformers

    from hf_tiny import hf_reference_model

    from megarl.models import attention_mask_for_megatron, build_model, load_hf_weights
    from megarl.parallel import init_distributed

    cfg = {"override_transformer_config": {**({"transformer_impl": spec} if spec else {}), **overrides}}
    init_distributed(cfg, device, seed=42)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    input_ids, attention_mask, position_ids = (t.to(device) for t in batch)
    b, s = input_ids.shape
    hf_config = transformers.AutoConfig.from_pretrained(hf_dir)
    layers = hf_config.num_hidden_layers

    hf = hf_reference_model(hf_dir, device)
    ref: dict[str, torch.Tensor] = {}
    hf_modules = {"embedding": hf.model.embed_tokens}
    for i, layer in enumerate(hf.model.layers):
        hf_modules.update({f"layer {i} attention": layer.self_attn, f"layer {i} router": layer.mlp.router,
                           f"layer {i} mlp": layer.mlp})
    hf_modules["logits"] = hf.lm_head

    def hf_fold(name, output):
        if name.endswith("router"):  # (logits, top-k probabilities [tokens, k], their experts [tokens, k])
            _, top, experts = output
            dense = torch.zeros(top.shape[0], hf_config.num_local_experts, device=top.device, dtype=top.dtype)
            return dense.scatter(1, experts, top).reshape(b, s, -1)  # as megatron's probs [tokens, E]
        return _first(output)

    hooks = _capture(hf_modules, ref, hf_fold)
    with torch.no_grad():
        hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    for h in hooks:
        h.remove()

    (chunk,) = build_model(hf_config, cfg, device=device, dtype=torch.float32)
    load_hf_weights([chunk], hf_dir)
    chunk.eval()
    got: dict[str, torch.Tensor] = {}
    mc_modules = {"embedding": chunk.embedding}
    for i, layer in enumerate(chunk.decoder.layers):
        mc_modules.update({f"layer {i} attention": layer.self_attention, f"layer {i} router": layer.mlp.router,
                           f"layer {i} mlp": layer.mlp})
    mc_modules["logits"] = chunk.output_layer

    def mc_fold(name, output):
        if name.endswith("router"):  # (probs [s * b, E], routing map)
            return output[0].reshape(s, b, -1).transpose(0, 1)
        return _with_bias(output).transpose(0, 1)  # [s, b, ...] -> [b, s, ...]

    hooks = _capture(mc_modules, got, mc_fold)
    first_moe_input: list[torch.Tensor] = []
    hooks.append(chunk.decoder.layers[0].mlp.register_forward_pre_hook(
        lambda _m, args: first_moe_input.append(args[0].detach())))
    with torch.no_grad():
        chunk(input_ids, position_ids, attention_mask_for_megatron(attention_mask))
    for h in hooks:
        h.remove()

    valid = attention_mask.bool().cpu()
    rows = []
    for name in ["embedding", *[f"layer {i} {m}" for i in range(layers) for m in ("attention", "router", "mlp")],
                 "logits"]:
        a, c = ref[name], got[name][..., : ref[name].shape[-1]]  # logits: megatron pads the vocabulary
        rows.append((name, float((a - c).abs()[valid].max())))
    return rows + _probe_first_moe(hf, chunk, first_moe_input[0], valid)


def main(args: list[str]) -> None:
    from helpers.dist_utils import run_distributed
    from hf_tiny import make_tiny_hf, padded_batch

    device = args[0] if args else "cuda"
    spec = args[1] if len(args) > 1 and "=" not in args[1] else ""
    overrides = dict(a.split("=", 1) for a in args[1:] if "=" in a)  # override_transformer_config strings
    hf_dir = make_tiny_hf("gpt_oss", tempfile.mkdtemp())
    rows = run_distributed(compare, 1, hf_dir, padded_batch(96), device, spec, overrides, timeout=240)[0]
    first = next((name for name, d in rows if d > 1e-5 and not name.startswith("probe")), None)
    print(f"GPT-OSS, megarl ({spec or 'default spec'} {overrides or ''}) vs HF, {device}, fp32: max |d| over valid tokens")
    for name, d in rows:
        print(f"  {name:22s} {d:.3e}{'   <- first above 1e-5' if name == first else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
