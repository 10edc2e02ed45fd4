#!/usr/bin/env bash
# The main job: set up, then validate, check renders, lint, build, test (image checks + smoke suite) and push
# the named flavours (tags, aliases or `all`; default: latest_cpu), then print how to resolve them.
#
#   ci/main-job.sh                      the latest_cpu flavour
#   ci/main-job.sh r2.9.0_3.11_cpu r2.6.0_3.11_cpu
#   ci/main-job.sh all                  the whole matrix (~8 GB and ~10 min per flavour; needs a base per python)
#
# Environment: VENV, XLA_IMAGES_STATE as for ci/setup.sh; REGISTRY overrides the site's registry.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
cd "$ROOT"
# Builds trust the host's CA bundle (TLS-intercepting proxies): name it for pip if nothing else does.
if [ -z "${PIP_CERT:-}${SSL_CERT_FILE:-}${REQUESTS_CA_BUNDLE:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi

flavours=("$@")
[ "${#flavours[@]}" -eq 0 ] && flavours=(latest_cpu)
[ "${flavours[0]}" = all ] && flavours=()
registry=()
[ -n "${REGISTRY:-}" ] && registry=(--registry "$REGISTRY")

bash ci/setup.sh --no-torch
xla() { "$VENV/bin/python" build.py "$@"; }
xla validate
xla render --check
xla lint
xla build --keep-going --prune-cache "${flavours[@]}"
xla test "${flavours[@]}"
xla push "${registry[@]}" "${flavours[@]}"
printf '\nPublished. Resolve a flavour with, e.g.:\n  ./build.py resolve --abi cxx11 --python 3.11 --accelerator cpu\n'
