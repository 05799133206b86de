#!/usr/bin/env bash
# One device call: install the carried wheels, then run the named steps, logs under $OUT.
#   bash benchmarks/gpu_run.sh ws ws7b tests actor
# Steps: ws (weight sync 1.5B), ws7b (weight sync 7B), tests (GPU-only tests),
#        actor (actor throughput with profiles and the previous LM head, same run).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-outputs}; mkdir -p "$OUT"
TR="torchrun --nproc_per_node=2"
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    ws)    timeout 240 $TR benchmarks/bench_weight_sync_gpu.py --bucket-mb 128 256 512 1024 --out weight_sync_gpu.json > "$OUT/ws.log" 2>&1; echo rc $?; grep -A40 "^# weight sync" "$OUT/ws.log" ;;
    ws7b)  timeout 240 $TR benchmarks/bench_weight_sync_gpu.py --shape 7b --bucket-mb 256 512 1024 --out weight_sync_gpu_7b.json > "$OUT/ws7b.log" 2>&1; echo rc $?; grep -A40 "^# weight sync" "$OUT/ws7b.log" ;;
    tests) timeout 300 python3 -m pytest -o addopts= -q -x tests/gpu tests/models -m gpu -rA -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1; echo rc $?; grep -E "passed|failed|PASSED|FAILED|Error" "$OUT/pytest_gpu.log" | tail -15 ;;
    actor) CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 420 $TR benchmarks/bench_actor_throughput.py --tp 2 --profile --iters 4 --legacy > "$OUT/actor.log" 2>&1; echo rc $?; grep -A12 "^# actor throughput" "$OUT/actor.log" ;;
  esac
done
