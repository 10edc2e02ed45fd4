#!/usr/bin/env bash
# The main job: set up (with a base for every python this machine can have), then validate, check renders, lint,
# and `ship` the named images (tags, aliases or `all`; default: latest_cpu): build, test (image checks + smoke
# suite) and push as one pipeline (docs/pipeline.md), then print how to resolve them.
#
#   ci/main-job.sh                      the latest_cpu flavour
#   ci/main-job.sh r2.9.0_3.11_cpu r2.6.0_3.11_cpu
#   ci/main-job.sh all                  every runtime and devel image this machine can build; what it cannot
#                                       (no base for the python, no wheels) is reported, with the fix
#
# Run it again after an interruption: what the registry already holds (same flavour id) is skipped.
# Environment: VENV, XLA_IMAGES_STATE as for ci/setup.sh; REGISTRY overrides the site's registry; ENGINES splits
# the run across engines (space-separated docker context names or DOCKER_HOST URLs; `default` is this one's).
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
[ "${flavours[0]}" = all ] && flavours=(--variant all)
options=()
[ -n "${REGISTRY:-}" ] && options+=(--registry "$REGISTRY")
for engine in ${ENGINES:-}; do options+=(--engine "$engine"); done

bash ci/setup.sh --no-torch --bases all
xla() { "$VENV/bin/python" build.py "$@"; }
xla validate
xla render --check
xla lint
xla ship "${options[@]}" "${flavours[@]}"
printf '\nPublished. Resolve a flavour with, e.g.:\n  ./build.py resolve --abi cxx11 --python 3.11 --accelerator cpu\n'
