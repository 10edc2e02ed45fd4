#!/usr/bin/env bash
# Run every test this machine can run: unit, engine (real Docker engine + registry) and xla (real torch_xla),
# including one real torch_xla image built, checked, smoke-tested, pushed, resolved and pulled.
# Sets everything up first (ci/setup.sh) and cleans up what the tests created afterwards.
#
#   ci/test.sh                 all suites
#   ci/test.sh -m unit         pytest options pass through (here: unit tests only)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
cd "$ROOT"
# Builds trust the host's CA bundle (TLS-intercepting proxies): name it for pip if nothing else does.
if [ -z "${PIP_CERT:-}${SSL_CERT_FILE:-}${REQUESTS_CA_BUNDLE:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi

bash ci/setup.sh
trap 'bash ci/cleanup.sh' EXIT

export XLA_IMAGES_TEST_CLEANUP="${XLA_IMAGES_TEST_CLEANUP:-1}"
# The slowest tests are listed at the end: where CI's minutes go, on every run.
"$VENV/bin/python" -m pytest tests -p no:cacheprovider --durations=25 "$@"
