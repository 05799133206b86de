#!/usr/bin/env bash
# Builds .gpuverl/ (git-ignored), the carry part for benchmarks/verl_side_by_side.sh: verl 0.9.1 and the
# pure-Python packages its GRPO path imports that neither the GPU image nor ../shared/gpu-stack's /tmp/site
# holds, as one xz tar (unpacked to /tmp/verl_site there), plus the runner and the reward file.
#   bash benchmarks/prepare_verl_part.sh        # from the repo root, here (package index needed), ~1 min
# Then one device call after the stack's: carry [".gpuverl"], command `bash .gpuverl/run_verl.sh`.
# Added packages and why (everything else verl names is in the image or in /tmp/site):
#   verl 0.9.1                                  the peer
#   codetiming, torchdata, datasets, multiprocess  verl's trainer / dataset (datasets reads the parquet)
#   orjson                                      verl.utils.tracking (the console logger)
#   transferqueue                               verl 0.9.1's default v1 trainer (trainer.use_v1=true)
#   uvicorn, model-hosting-container-standards, jmespath, supervisor
#                                               vLLM's OpenAI server, which verl's async rollout runs
#                                               (left out of /tmp/site, which serves offline LLM use only)
#   mbridge 0.15.1                              verl's Megatron backend with vanilla_mbridge=true
# No vLLM shim: every vLLM name verl's default GRPO path imports exists in vLLM 0.20.0 (verl gates its newer
# uses on vllm.__version__), checked by source scan when this part was first built.
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
mkdir -p "$REPO/.git/info"
grep -qx '/.gpuverl/' "$REPO/.git/info/exclude" 2>/dev/null || echo '/.gpuverl/' >> "$REPO/.git/info/exclude"
rm -rf "$REPO/.gpuverl"; mkdir -p "$REPO/.gpuverl"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$WORK/site" -cf - . | xz -9 -T0 > "$REPO/.gpuverl/verl_site.tar.xz"
cp "$HERE/verl_side_by_side.sh" "$REPO/.gpuverl/run_verl.sh"
cp "$HERE/verl_demo_reward.py" "$REPO/.gpuverl/verl_demo_reward.py"
ls -la "$REPO/.gpuverl"; du -sh "$REPO/.gpuverl"
echo "device call: carry [\".gpuverl\"]  command: bash .gpuverl/run_verl.sh   (after the .gpustack calls)"
