"""Rank body for tests/weight_sync/test_tp_gather.py (spawned by run_distributed)."""

from __future__ import annotations

import torch


def bucketed_equals_per_tensor(hf_dir: str, bucket_sizes: list[int]) -> dict:
    """TP=2 on CPU: ``export_hf_weights_bucketed`` for each bucket size, without and with
    destinations for every tensor, vs ``export_hf_weights``: names, order, dtype, bits."""
    import transformers

    from megarl.models import build_model, export_hf_weights, load_hf_weights
    from megarl.parallel import init_distributed
    from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

    cfg = {"tensor_model_parallel_size": 2}
    init_distributed(cfg, "cpu", seed=42)
    hf_config = transformers.AutoConfig.from_pretrained(hf_dir)
    chunks = build_model(hf_config, cfg, device="cpu")
    load_hf_weights(chunks, hf_dir)
    reference = [(n, t.clone()) for n, t in export_hf_weights(chunks, hf_config)]
    failures = []
    for size in bucket_sizes:
        for with_dest in (False, True):
            dest = {n: torch.full_like(t, float("nan")) for n, t in reference} if with_dest else None
            got = [(n, t.clone()) for n, t in export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=size, destinations=dest)]
            if [n for n, _ in got] != [n for n, _ in reference]:
                failures.append((size, with_dest, "names/order"))
                continue
            for (name, a), (_, b) in zip(got, reference):
                if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                    failures.append((size, with_dest, name))
    return {"failures": failures, "tensors": len(reference)}
