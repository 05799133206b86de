#!/usr/bin/env bash
# flash-linear-attention for the GPU machine, as an overlay beside the stack (.gpustack/x02/fla.tar.xz, unpacked
# by .gpustack/bin/receive.sh into /tmp/site-fla, on the GPU scripts' PYTHONPATH): Qwen3-Next's and Qwen3.5's
# gated DeltaNet kernels on CUDA (megarl/models/qwen_hybrid.py), the version requirements/gpu-lock.txt pins.
# Both wheels are pure Python (triton kernels).
#   bash scripts/prepare_fla_overlay.sh      # from the repo root; package index needed; ~10 s
set -euo pipefail
FLA_VERSION=0.6.0
work=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$work/wheels" "flash-linear-attention==$FLA_VERSION" "fla-core==$FLA_VERSION"
for whl in "$work"/wheels/*.whl; do python3 -m zipfile -e "$whl" "$work/site"; done
mkdir -p .gpustack/x02
tar -cJf .gpustack/x02/fla.tar.xz -C "$work/site" .
rm -rf "$work"
ls -la .gpustack/x02/fla.tar.xz
