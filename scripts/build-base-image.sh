#!/usr/bin/env bash
# Builds a Python base image locally, for machines that cannot pull the Dockerfile's default
# base (python:3.11.x-slim-bookworm) because no image registry is reachable.
#
#   bash scripts/build-base-image.sh [IMAGE]        (default localhost/python-local:3.11-bookworm)
#   podman build --build-arg PYTHON_IMAGE=localhost/python-local:3.11-bookworm --target runtime .
#
# The result has the official python image's layout: a Debian bookworm minbase whose
# /usr/local is a virtual environment over Debian's python3 (/usr/local/bin/python, pip,
# setuptools and wheel in /usr/local/lib/python3.11/site-packages, no EXTERNALLY-MANAGED), so
# the Dockerfile builds unchanged on it. CA certificates the build machine adds in
# /usr/local/share/ca-certificates (a company or sandbox proxy) are trusted inside too.
#
# Cached: an image that exists and carries this script's hash in its label is kept, so a warm
# run costs one `podman image inspect`. Set FORCE=1 to rebuild. Needs root (mmdebstrap's root
# mode) and the packages scripts/install-system-deps.sh installs (podman, mmdebstrap).
set -euo pipefail

IMAGE=${1:-localhost/python-local:3.11-bookworm}
ENGINE=${CONTAINER_ENGINE:-podman}
SUITE=bookworm
recipe=$(sha256sum "$0" | cut -c1-16)

current=$("$ENGINE" image inspect --format '{{ index .Config.Labels "io.automq.base-recipe" }}' "$IMAGE" 2>/dev/null || true)
if [ "${FORCE:-0}" != 1 ] && [ "$current" = "$recipe" ]; then
  echo "build-base-image: $IMAGE is up to date (recipe $recipe)" >&2
  exit 0
fi

for tool in mmdebstrap "$ENGINE"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-base-image: $tool is not installed (bash scripts/install-system-deps.sh installs it)" >&2
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "build-base-image: mmdebstrap needs root here (its root mode); run it with sudo" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/automq-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "build-base-image: building $IMAGE from Debian $SUITE (recipe $recipe)" >&2

# Hooks run outside the chroot with the root directory as $1. The build machine's resolver is
# what mmdebstrap uses while building; pip needs PIP_CERT because it trusts its own CA bundle,
# not the system's, and `wheel` because some sdists (pyspark) build with bdist_wheel.
mmdebstrap --quiet --mode=root --variant=minbase \
  --include=python3,python3-venv,ca-certificates,netbase,tzdata \
  --customize-hook='for c in /usr/local/share/ca-certificates/*.crt; do [ -e "$c" ] && cp "$c" "$1/usr/local/share/ca-certificates/"; done; true' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  --customize-hook='chroot "$1" python3 -m venv /usr/local' \
  --customize-hook='chroot "$1" env PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_CONFIG_FILE=/dev/null /usr/local/bin/python -m pip install --no-cache-dir --quiet --upgrade pip setuptools wheel' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/root/.cache' \
  "$SUITE" "$work/rootfs.tar"

"$ENGINE" import --quiet \
  --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL io.automq.base-recipe=$recipe" \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "build-base-image: $IMAGE built" >&2
