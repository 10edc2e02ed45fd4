#!/usr/bin/env bash
# Run every test this machine can run: unit, engine (real Docker engine + registry) and xla (real torch_xla),
# including one real torch_xla image built, checked, smoke-tested, pushed, resolved and pulled.
# Sets everything up first (ci/setup.sh) and cleans up what the tests created afterwards.
#
#   ci/test.sh                 all suites: unit and xla on two workers, then the engine suite alone
#   ci/test.sh -m unit         pytest options pass through (here: unit tests only), in one serial run
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
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider)
# With options, one run of what they select, as given. The slowest tests are listed at the end: where CI's
# minutes go, on every run.
if [ "$#" -gt 0 ]; then
    "${PYTEST[@]}" tests --durations=25 "$@"
    exit 0
fi
# Without: the unit and xla suites on two workers (pytest-xdist, one test file per worker at a time, so a
# module's fixtures are made once), then the engine suite alone and in order (one engine, one registry, one
# disk). Both run even when the first fails; the exit code is the first failure's.
status=0
"${PYTEST[@]}" -p xdist -n 2 --dist loadfile tests -m "not engine" --durations=15 || status=$?
"${PYTEST[@]}" tests -m engine --durations=25 || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
exit "$status"
