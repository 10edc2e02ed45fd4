#!/usr/bin/env bash
# Set up everything xla-images and its tests need on a fresh Debian 12 machine (as root), idempotently:
# Debian packages, the project's virtualenv (.venv, pinned dependencies + torch_xla for tests/xla), a Docker
# engine, a registry on 127.0.0.1, and bootstrapped base images (python 3.11 unless --bases says otherwise).
#
#   ci/setup.sh                       everything
#   ci/setup.sh --no-torch            skip torch/torch_xla in .venv (the main job does not need them on the host)
#   ci/setup.sh --bases all           bootstrap a base for every python of the matrix this machine can have (one
#                                     line for each python it cannot have, and why); default: --bases 3.11
#   ci/setup.sh --bases 3.11,3.13     these pythons' bases; --bases none: no base
#
# On a machine that has it all, every step is a check: the engine steps look before they install or start; pip
# runs only when the venv's stamp (below) differs; `build.py base` skips a base whose image exists. Measured here
# (2026-12-07, set-up machine, --no-torch --bases all): 1.9 s, of which the doctor's report 0.8 s and the bases'
# check 0.6 s; with pip run every time it took 4.5 s (pip 2.9 s; the torch lock's no-op pip another 1.7 s).
#
# Environment: XLA_IMAGES_STATE (engine/registry state, default /var/lib/xla-images), VENV (default .venv),
# HOST_TORCH_XLA (torch_xla version installed on the host for tests/xla, default 2.9.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
HOST_TORCH_XLA="${HOST_TORCH_XLA:-2.9.0}"
WITH_TORCH=1
BASES=3.11

say() { printf 'setup: %s\n' "$*"; }
usage() { printf 'usage: %s [--no-torch] [--bases all|none|X.Y[,X.Y...]]\n' "$0" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --no-torch) WITH_TORCH=0 ;;
        --bases) [ "$#" -ge 2 ] || usage; BASES="$2"; shift ;;
        --bases=*) BASES="${1#--bases=}" ;;
        *) usage ;;
    esac
    shift
done
case "$BASES" in
    all|none) ;;
    *) [[ "$BASES" =~ ^[0-9]+\.[0-9]+(,[0-9]+\.[0-9]+)*$ ]] || usage ;;
esac

# The stamp of a venv step: what its result depends on — the files it installs from, this checkout (the editable
# install points at it), the venv's python, and every distribution the venv holds, by name and version (a
# dist-info directory each). Any change to one of them (a pin edited, a package removed or upgraded by hand, a
# venv made anew) changes the stamp, and the step runs again. Written only after the step succeeded.
STAMPS="$VENV/.xla-images-setup"
venv_stamp() {
    {
        printf '%s\n' "$ROOT" "$(readlink -f "$VENV/bin/python")"
        cat "$VENV/pyvenv.cfg" "$@"
        find "$VENV"/lib/python3*/site-packages -maxdepth 1 -name '*.dist-info' -printf '%f\n' | LC_ALL=C sort
    } | sha256sum | cut -d' ' -f1
}
stamp_matches() {  # stamp_matches NAME FILE...: the step NAME already ran with these inputs
    [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$(venv_stamp "${@:2}")" ]
}

cd "$ROOT"
bash ci/engine.sh install
bash ci/engine.sh start
bash ci/registry.sh start

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
fi
lock="Dockerfiles/r${HOST_TORCH_XLA}_3.11_cpu/requirements.lock"
deps_done=0
torch_done=0
if stamp_matches deps pyproject.toml; then
    say "xla-images and its pinned test dependencies: installed as pyproject.toml pins them (stamp matches)"
else
    say "installing xla-images and its pinned test dependencies"
    # pip 26 resolves locks with range requests (fast-deps); the pip a venv starts with is older.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check pip==26.3
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test]"
    deps_done=1
fi
if [ "$WITH_TORCH" = 1 ]; then
    if [ "$deps_done" = 0 ] && stamp_matches torch "$lock"; then
        say "torch_xla $HOST_TORCH_XLA on the host: installed as $lock pins it (stamp matches)"
    else
        # torch is pinned to what torch_xla was built against; the lock of the same flavour pins the closure.
        # No pip cache: it would keep another ~3.5 GB of CUDA wheels on a disk the real image needs.
        say "installing torch_xla $HOST_TORCH_XLA on the host for tests/xla (from $lock)"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --require-hashes \
            --only-binary=:all: -r "$lock"
        torch_done=1
    fi
fi
# Stamped after both steps: installing torch changes the venv's distributions, which the deps stamp includes.
mkdir -p "$STAMPS"
if [ "$deps_done" = 1 ] || [ "$torch_done" = 1 ]; then
    venv_stamp pyproject.toml >"$STAMPS/deps"
    if [ "$WITH_TORCH" = 1 ]; then venv_stamp "$lock" >"$STAMPS/torch"; else rm -f "$STAMPS/torch"; fi
fi

case "$BASES" in
    none) say "no base image bootstrapped (--bases none)" ;;
    all)
        say "bootstrapping a base for every python of the matrix this machine can have (skipped when present)"
        "$VENV/bin/python" build.py base ;;
    *)
        say "bootstrapping the python ${BASES//,/ } base image(s) (skipped when present)"
        IFS=, read -r -a pythons <<<"$BASES"
        "$VENV/bin/python" build.py base "${pythons[@]/#/--python=}" ;;
esac
"$VENV/bin/python" build.py doctor || true
