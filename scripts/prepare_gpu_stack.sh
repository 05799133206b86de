#!/usr/bin/env bash
# Stage the GPU machine's Python stack with ../shared/gpu-stack/prepare.sh (see its README): vLLM 0.26.0
# (the newest release for the machine's torch 2.11.0), Ray 2.60.0, megatron-core 0.19.2 and the rest of
# requirements/gpu-ship-vllm0.26.txt. Writes .gpustack/ (git-ignored) in the repo root and prints the
# device calls. vLLM 0.26.0's wheel is tagged manylinux_2_28, which prepare.sh's own download (asking
# for manylinux_2_35) does not find: it is fetched here and passed as VLLM_WHL.
#
#   bash scripts/prepare_gpu_stack.sh        # from anywhere in the repo; ~7 min on 2 cores (xz -9)
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.26.0
WORK=${GPUSTACK_WORK:-/tmp/gpustack-build}
mkdir -p "$WORK/wheels"
if ! ls "$WORK"/wheels/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$WORK/wheels" "vllm==$VLLM_VERSION"
fi
VLLM_WHL=$(ls "$WORK"/wheels/vllm-"$VLLM_VERSION"-*.whl | head -1)
GPUSTACK_WORK=$WORK VLLM_VERSION=$VLLM_VERSION VLLM_WHL=$VLLM_WHL SHIP_REQS=$PWD/requirements/gpu-ship-vllm0.26.txt \
    bash ../shared/gpu-stack/prepare.sh
