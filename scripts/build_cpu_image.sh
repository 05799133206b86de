#!/usr/bin/env bash
# Build the Dockerfile's cpu target without a daemon, and run the quickstart in it:
#   1. `buildah bud --target cpu --build-arg BASE_IMAGE=$BASE_IMAGE` (vfs storage, chroot isolation);
#   2. `buildah run` of `python -m megarl.main_ppo` (the quickstart, QUICKSTART_ARGS appended).
# Needs root, buildah (apt-get install buildah) and BASE_IMAGE: an image buildah can pull or already has
# whose python3 is 3.12 (e.g. python:3.12-slim-bookworm). Debian's own packages cannot make one
# (bookworm has Python 3.11, trixie 3.13), so there is no debootstrap route any more.
#
#   sudo BASE_IMAGE=python:3.12-slim-bookworm scripts/build_cpu_image.sh   # from the repo root
#
# Environment: IMAGE_WORK (/tmp/megarl-image), CA_BUNDLE (a site CA bundle passed as the build secret
# ca_bundle; default: the system's), LOCAL_WHEELS_FROM (a folder whose torch 2.13.0 CPU wheel for
# Python 3.12 is offered to the build, for sites where PyTorch's CPU index is not reachable),
# QUICKSTART_ARGS (trainer.total_training_steps=2).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${BASE_IMAGE:?set BASE_IMAGE to a Python 3.12 image (e.g. python:3.12-slim-bookworm)}"
W="${IMAGE_WORK:-/tmp/megarl-image}"
CA="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
QUICK="${QUICKSTART_ARGS:-trainer.total_training_steps=2}"
B=(buildah --storage-driver vfs --root "$W/storage" --runroot "$W/run")
T0=$SECONDS
say() { echo "[build_cpu_image +$((SECONDS - T0))s] $*"; }
mkdir -p "$W"

rm -rf .wheels && mkdir -p .wheels
if [ -n "${LOCAL_WHEELS_FROM:-}" ]; then cp "${LOCAL_WHEELS_FROM}"/torch-2.13.0+cpu-cp312-*.whl .wheels/ 2>/dev/null || true; fi
say "buildah bud --target cpu (log $W/build.log)"
secret=()
[ -s "$CA" ] && secret=(--secret "id=ca_bundle,src=$CA")
"${B[@]}" bud --isolation chroot --layers=false --target cpu "${secret[@]}" \
  --build-arg BASE_IMAGE="$BASE" -t localhost/megarl:cpu . > "$W/build.log" 2>&1 \
  || { rm -rf .wheels; tail -30 "$W/build.log" >&2; exit 1; }
rm -rf .wheels
say "built localhost/megarl:cpu"

ctr=$("${B[@]}" from localhost/megarl:cpu)
trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
say "quickstart in the image: python -m megarl.main_ppo --config-name=ppo_megatron_trainer $QUICK"
# shellcheck disable=SC2086
"${B[@]}" run --isolation chroot "$ctr" -- python -m megarl.main_ppo --config-name=ppo_megatron_trainer \
  trainer.default_local_dir=/tmp/run $QUICK > "$W/quickstart.log" 2>&1 && code=0 || code=$?
grep -E "\[megarl\] step |megarl: the run|problem:" "$W/quickstart.log" | cut -c1-300 | tail -5
say "quickstart exit ${code}"
exit "${code}"
