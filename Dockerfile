# megarl image for H100 (sm_90) clusters.
#
# Base: NGC PyTorch, which carries CUDA, NCCL, cuDNN, transformer-engine, apex and
# flash-attention built against its own torch. vLLM's wheels pin a different torch, so a
# plain `pip install vllm` would replace NGC's torch (and break TE/apex). Instead vLLM is
# built from source against the torch already in the image (vLLM's use_existing_torch.py),
# and every other pip install runs under a constraints file that freezes NGC's torch stack.
# The last step fails the build if torch changed anyway.
#
#   docker build -t megarl:h100 .
#   docker run --gpus all --ipc=host --network=host --ulimit memlock=-1 -it megarl:h100
#
# Build time is dominated by the vLLM CUDA build (~30-60 min with MAX_JOBS=16).
ARG NGC_TAG=25.10
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}-py3

ARG VLLM_VERSION=v0.32.0
ARG MEGATRON_CORE_VERSION=0.16.1
ARG MAX_JOBS=16
ENV TORCH_CUDA_ARCH_LIST="9.0" \
    MAX_JOBS=${MAX_JOBS} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CONSTRAINT=/opt/megarl/ngc-constraints.txt \
    CUDA_DEVICE_MAX_CONNECTIONS=1 \
    NCCL_NVLS_ENABLE=0 \
    VLLM_WORKER_MULTIPROC_METHOD=spawn

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Freeze NGC's torch stack (torch, TE, apex, flash-attn, triton, ...) for every later pip call.
RUN mkdir -p /opt/megarl \
    && pip list --format=freeze \
       | grep -iE '^(torch|torchvision|torchaudio|transformer[-_]engine[-_a-z0-9]*|apex|flash[-_]attn|triton|nvidia-[a-z0-9-]+)==' \
       > /opt/megarl/ngc-constraints.txt \
    && python -c "import torch; print(torch.__version__)" > /opt/megarl/ngc-torch-version.txt \
    && cat /opt/megarl/ngc-constraints.txt

# vLLM from source against the existing torch (same version as the CPU stack megarl is tested on).
WORKDIR /opt
RUN git clone --depth 1 --branch ${VLLM_VERSION} https://github.com/vllm-project/vllm.git
WORKDIR /opt/vllm
RUN python use_existing_torch.py \
    && pip install -r requirements/build.txt \
    && pip install --no-build-isolation . \
    && rm -rf /opt/vllm/build

# The rest of the stack (megatron-core 0.16.x, Ray, Hydra, data and logging), at the
# versions megarl's CPU CI runs.
RUN pip install \
        "megatron-core==${MEGATRON_CORE_VERSION}" \
        "ray[default]==2.60.0" \
        "hydra-core==1.3.8" \
        "omegaconf==2.3.1" \
        "pyarrow==26.0.1" \
        "tensordict==0.15.3" \
        "transformers==5.19.0" \
        "safetensors==0.8.0" \
        "tensorboard==2.21.0" \
        "wandb==0.31.0" \
        "pytest==9.2.0"

# megarl, editable (the GPU extra's vllm / transformer-engine are already satisfied).
WORKDIR /workspace/megarl
COPY . /workspace/megarl
RUN pip install --no-build-isolation -e ".[gpu,test]"

# Fail the build if anything above replaced NGC's torch.
RUN test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/megarl/ngc-torch-version.txt)" \
    && python -c "import torch, vllm, megatron.core, transformer_engine, ray, hydra, megarl; print('megarl image OK', torch.__version__, vllm.__version__)"

CMD ["/bin/bash"]
