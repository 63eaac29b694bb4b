#!/usr/bin/env bash
# Creates .venv (Python 3.11 or newer) in the repository and installs the project into it,
# editable, with the extras given (e.g. `dev`). Works where the system Python refuses pip
# (PEP 668 "externally-managed-environment" on Debian/Ubuntu) and on macOS; needs no root,
# except to apt-get install python3-venv on a Debian/Ubuntu that lacks it.
#   bash scripts/setup-venv.sh          # the package: `.venv/bin/automq`
#   bash scripts/setup-venv.sh dev      # plus everything the tests need
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 \
     && "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "setup-venv: Python 3.11 or newer is needed; found: $(python3 --version 2>&1 || echo none)." >&2
  echo "setup-venv: install it (Debian/Ubuntu: apt-get install python3; macOS: brew install python@3.12) and rerun." >&2
  exit 1
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
  if ! "$python" -m venv .venv 2>/tmp/automq-venv.err; then
    rm -rf .venv
    # Debian and Ubuntu ship venv's ensurepip separately (python3-venv / python3.X-venv).
    version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then
      sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
      echo "setup-venv: $python cannot create a virtual environment; installing python$version-venv" >&2
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "python$version-venv" >/dev/null \
        || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
      "$python" -m venv .venv
    else
      cat /tmp/automq-venv.err >&2
      echo "setup-venv: $python cannot create a virtual environment; install python$version-venv and rerun." >&2
      exit 1
    fi
  fi
fi

spec="."
[ -z "$extras" ] || spec=".[$extras]"
echo "setup-venv: installing $spec into .venv ($(.venv/bin/python --version))" >&2
.venv/bin/python -m pip install --disable-pip-version-check -q -e "$spec"

# Stream-processing apps the end-to-end tests run as their own processes (tests/e2e/apps):
# their own environment, because quixstreams caps confluent-kafka below the version the suite needs.
case ",$extras," in
  *,dev,*)
    if ! .venv-streams/bin/python -m pip --version >/dev/null 2>&1; then
      rm -rf .venv-streams
      "$python" -m venv .venv-streams
    fi
    echo "setup-venv: installing tests/e2e/apps/requirements.txt into .venv-streams" >&2
    .venv-streams/bin/python -m pip install --disable-pip-version-check -q -r tests/e2e/apps/requirements.txt
    ;;
esac
