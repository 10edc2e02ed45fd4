#!/usr/bin/env bash
# Set up everything xla-images and its tests need on a fresh Debian 12 machine (as root), idempotently:
# Debian packages, the project's virtualenv (.venv, pinned dependencies + torch_xla for tests/xla), a Docker
# engine, a registry on 127.0.0.1, and the bootstrapped base image for python 3.11.
#
#   ci/setup.sh            everything
#   ci/setup.sh --no-torch skip torch/torch_xla in .venv (the main job does not need them on the host)
#
# Environment: XLA_IMAGES_STATE (engine/registry state, default /var/lib/xla-images), VENV (default .venv),
# HOST_TORCH_XLA (torch_xla version installed on the host for tests/xla, default 2.9.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
HOST_TORCH_XLA="${HOST_TORCH_XLA:-2.9.0}"
WITH_TORCH=1
[ "${1:-}" = "--no-torch" ] && WITH_TORCH=0

say() { printf 'setup: %s\n' "$*"; }

cd "$ROOT"
bash ci/engine.sh install
bash ci/engine.sh start
bash ci/registry.sh start

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
fi
say "installing xla-images and its pinned test dependencies"
# pip 26 resolves locks with range requests (fast-deps); the pip a venv starts with is older.
"$VENV/bin/pip" install --quiet --disable-pip-version-check pip==26.3
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test]"
if [ "$WITH_TORCH" = 1 ]; then
    # torch is pinned to what torch_xla was built against; the lock of the same flavour pins the closure.
    # No pip cache: it would keep another ~3.5 GB of CUDA wheels on a disk the real image needs.
    lock="Dockerfiles/r${HOST_TORCH_XLA}_3.11_cpu/requirements.lock"
    say "installing torch_xla $HOST_TORCH_XLA on the host for tests/xla (from $lock)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --require-hashes --only-binary=:all: -r "$lock"
fi

say "bootstrapping the python 3.11 base image (skipped when present)"
"$VENV/bin/python" build.py base --python 3.11
"$VENV/bin/python" build.py doctor || true
