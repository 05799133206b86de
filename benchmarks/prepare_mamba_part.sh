#!/usr/bin/env bash
# Builds .gpumamba/ (excluded from git), the carry part for `gpu_scale.sh mamba_triton`: mamba-ssm's source
# distribution (0.2 MiB; its Triton kernels are Python, its CUDA extensions are not built). Metadata needs torch:
# this uses the project's virtual environment, here (package index needed).
#   bash benchmarks/prepare_mamba_part.sh      # from the repo root; then carry [".gpumamba"] in the call that runs it
set -euo pipefail
VERSION=${MAMBA_SSM_VERSION:-2.3.2.post1}
mkdir -p .gpumamba
MAMBA_SKIP_CUDA_BUILD=TRUE .venv/bin/pip download "mamba-ssm==$VERSION" --no-deps --no-binary :all: \
  --no-build-isolation -d .gpumamba -q
grep -qx "/.gpumamba/" .git/info/exclude 2>/dev/null || echo "/.gpumamba/" >> .git/info/exclude
ls -la .gpumamba
