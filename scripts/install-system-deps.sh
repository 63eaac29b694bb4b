#!/usr/bin/env bash
# Installs what the project needs that pip cannot: Java 17 (PySpark), kcat (a real Kafka
# client used by the tests), podman with runc and mmdebstrap (the image tests build a base
# image locally and run the project's images; runc because crun fails on hybrid cgroups) and
# the PostgreSQL server (the lake tests start one for their Iceberg SQL catalogs), and shellcheck
# (tests/project checks every shell script of the project with it).
# Idempotent: does nothing when everything is present. Debian/Ubuntu.
set -euo pipefail

missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)  # tests/packaging: the images' shell scripts
if ! java -version 2>&1 | grep -qE 'version "(17|21)'; then
  missing+=(openjdk-17-jre-headless)
fi
# tests/support/postgres_server.py looks for initdb in /usr/lib/postgresql/*/bin, then on PATH
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && ! command -v initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: need ${missing[*]} but apt-get is not available; install them by hand" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-system-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
if [[ " ${missing[*]} " == *" postgresql "* ]]; then
  # the tests run throwaway servers of their own: no system cluster created and started on 5432
  $SUDO mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.d/automq-tests.conf >/dev/null
fi
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
