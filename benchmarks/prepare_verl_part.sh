#!/usr/bin/env bash
# Builds .gpuverl/ (git-ignored), the carry part for benchmarks/verl_side_by_side.sh: verl 0.9.1 and the
# pure-Python packages its GRPO path imports that neither the GPU image nor scripts/prepare_gpu_stack.sh's /tmp/site
# (vLLM 0.26.0, Ray 2.60, megatron-core 0.19.2; no mbridge, no Megatron-Bridge) holds, as one xz tar (unpacked to
# /tmp/verl_site there), plus the runner and the reward file.
#   bash benchmarks/prepare_verl_part.sh        # from the repo root, here (package index needed), ~10 s; 1.9 MiB
# Then, after the stack's calls: carry [".gpuverl"], command `bash .gpuverl/run_verl.sh` or `gpu_scale.sh verl7b_tp2`.
# Added packages and why (everything else verl names is in the image or in /tmp/site):
#   verl 0.9.1                                  the peer
#   codetiming, torchdata, datasets, multiprocess  verl's trainer / dataset (datasets reads the parquet)
#   orjson                                      verl.utils.tracking (the console logger)
#   transferqueue                               verl 0.9.1's default v1 trainer (trainer.use_v1=true)
#   uvicorn, model-hosting-container-standards, jmespath, supervisor
#                                               vLLM's OpenAI server, which verl's async rollout runs
#                                               (left out of /tmp/site, which serves offline LLM use only)
#   mbridge 0.15.1                              verl's Megatron backend with vanilla_mbridge=true
# Checked against vLLM 0.26.0 / megatron-core 0.19.2 on CPU (issue 31): every vllm / megatron.core / mbridge name
# verl 0.9.1 imports or reads exists there except on paths this workload does not take (dynamic CP, async
# checkpoint save, FP8 / QAT / ModelOpt, NPU, LoRA fallbacks inside try/except); verl's vLLM server arguments parse
# with vLLM 0.26's `serve` parser and its build_app / init_app_state probes match; the import closure of the
# Megatron GRPO path resolves with only the image's packages, /tmp/site and this part. mbridge 0.15.1 builds its
# TransformerConfig with megatron-core 0.19.2; it reads hf_config.rope_theta, which transformers 5 moved into
# rope_parameters: the runner sets it back with verl's model.override_config (no shim). Megatron-Bridge (verl's
# default, vanilla_mbridge=false) is not shipped: verl 0.9.1 pins 0.5.2, megatron-core 0.19.2 pairs with 0.6.x,
# and `import megatron.bridge` pulls every model bridge and data module (datasets, TE's LoRA layers, ...); mbridge is
# what the 0.5B comparison used, and either builds the same megatron-core GPTModel with TE's layer spec.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${GPUVERL_REPO:-$PWD}
WORK=${GPUVERL_WORK:-/tmp/gpuverl-build}
PY=${PYTHON:-python3}
DL=(--python-version 3.12 --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any --only-binary=:all: --no-deps)
PKGS=(verl==0.9.1 codetiming==1.4.0 torchdata==0.11.0 datasets==5.2.0 multiprocess==0.70.19 orjson==3.13.0
      transferqueue==0.1.11 uvicorn==0.54.0 model-hosting-container-standards==0.1.16 jmespath==1.1.0
      supervisor==4.3.0 mbridge==0.15.1)
rm -rf "$WORK"; mkdir -p "$WORK/wheels" "$WORK/site"
"$PY" -m pip download -q "${DL[@]}" -d "$WORK/wheels" "${PKGS[@]}"
for w in "$WORK"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$WORK/site"; done
# top-level tests/scripts/recipe/tutorial of the verl and transferqueue wheels would shadow the repo's own
rm -rf "$WORK/site"/{recipe,scripts,tests,tutorial}
find "$WORK/site" -name __pycache__ -type d -prune -exec rm -rf {} +
EXCLUDE=$(git -C "$REPO" rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpuverl/' "$EXCLUDE" 2>/dev/null || echo '/.gpuverl/' >> "$EXCLUDE"
rm -rf "$REPO/.gpuverl"; mkdir -p "$REPO/.gpuverl"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$WORK/site" -cf - . | xz -9 -T0 > "$REPO/.gpuverl/verl_site.tar.xz"
cp "$HERE/verl_side_by_side.sh" "$REPO/.gpuverl/run_verl.sh"
cp "$HERE/verl_demo_reward.py" "$REPO/.gpuverl/verl_demo_reward.py"
ls -la "$REPO/.gpuverl"; du -sh "$REPO/.gpuverl"
echo "device call: carry [\".gpuverl\"]  command: bash .gpuverl/run_verl.sh [megatron|megatron7b]   (after the .gpustack calls)"
