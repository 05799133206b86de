#!/usr/bin/env bash
# Build the Dockerfile's cpu target without a daemon or a registry, and run the quickstart in it:
#   1. a Debian bookworm base (python3, venv) made here with debootstrap, imported with buildah;
#   2. `buildah bud --target cpu --build-arg BASE_IMAGE=<that base>` (vfs storage, chroot isolation);
#   3. `buildah run` of `python -m megarl.main_ppo` (the quickstart, QUICKSTART_ARGS appended).
# Needs root and: apt-get install buildah debootstrap. Everything lives under IMAGE_WORK.
#
#   sudo scripts/build_cpu_image.sh                       # from the repo root
#
# Environment: IMAGE_WORK (/tmp/megarl-image), DEBIAN_MIRROR (http://deb.debian.org/debian),
# CA_BUNDLE (a site CA bundle passed as the build secret ca_bundle; default: the system's),
# LOCAL_WHEELS_FROM (a folder whose torch CPU wheel is offered to the build, for sites where
# download.pytorch.org is not reachable), QUICKSTART_ARGS (trainer.total_training_steps=2).
set -euo pipefail
cd "$(dirname "$0")/.."
W="${IMAGE_WORK:-/tmp/megarl-image}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
QUICK="${QUICKSTART_ARGS:-trainer.total_training_steps=2}"
B=(buildah --storage-driver vfs --root "$W/storage" --runroot "$W/run")
T0=$SECONDS
say() { echo "[build_cpu_image +$((SECONDS - T0))s] $*"; }
mkdir -p "$W"

if ! "${B[@]}" inspect localhost/megarl-base:bookworm >/dev/null 2>&1; then
  say "debootstrap bookworm"
  rm -rf "$W/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates,build-essential,git \
    bookworm "$W/rootfs" "$MIRROR" > "$W/debootstrap.log" 2>&1
  cp /etc/apt/sources.list* -r "$W/rootfs/etc/apt/" 2>/dev/null || true
  tar -C "$W/rootfs" -cf "$W/rootfs.tar" .
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n' > "$W/Containerfile.base"
  say "import base"
  "${B[@]}" bud --isolation chroot -f "$W/Containerfile.base" -t localhost/megarl-base:bookworm "$W" > "$W/base.log" 2>&1
  rm -rf "$W/rootfs" "$W/rootfs.tar"
fi

rm -rf .wheels && mkdir -p .wheels
if [ -n "${LOCAL_WHEELS_FROM:-}" ]; then cp "${LOCAL_WHEELS_FROM}"/torch-2.13.0+cpu-*.whl .wheels/ 2>/dev/null || true; fi
say "buildah bud --target cpu (log $W/build.log)"
secret=()
[ -s "$CA" ] && secret=(--secret "id=ca_bundle,src=$CA")
"${B[@]}" bud --isolation chroot --layers=false --target cpu "${secret[@]}" \
  --build-arg BASE_IMAGE=localhost/megarl-base:bookworm -t localhost/megarl:cpu . > "$W/build.log" 2>&1 \
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
