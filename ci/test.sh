#!/usr/bin/env bash
# Run every test this machine can run: unit, engine (real Docker engine + registry) and xla (real torch_xla),
# including one real torch_xla image built, checked, smoke-tested, pushed, resolved and pulled.
# Sets everything up first (ci/setup.sh) and cleans up what the tests created afterwards.
#
#   ci/test.sh                 all suites: unit and xla on two workers beside the light engine suite, then
#                              the real-image engine tests alone
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
# Without, three runs. First, side by side: the unit and xla suites on two workers (pytest-xdist, one test file
# per worker at a time, so a module's fixtures are made once), which keep both cores busy, and the light engine
# suite (tiny images, registries), which mostly waits on the engine; the engine suite's output is kept in a file
# and printed once both have ended, so neither's report is cut into the other's. Then the real-image tests
# (`slow`) alone: they need both cores, and the light tests prune the build cache a real build is still using.
# Every run runs even when one before it failed; the exit code is the first failure's.
status=0
phase_logs="$(mktemp -d "${TMPDIR:-/tmp}/xla-images-ci.XXXXXX")"
light_pid=""
stop_light() {
    # ci/test.sh ended early (interrupted, or set -e): the background run must not outlive it; ci/cleanup.sh
    # then removes what its tests made.
    [ -z "$light_pid" ] || kill -TERM "$light_pid" 2>/dev/null || true
}
trap 'stop_light; rm -rf "$phase_logs"; bash ci/cleanup.sh' EXIT
"${PYTEST[@]}" tests -m "engine and not slow" --durations=15 > "$phase_logs/engine-light.log" 2>&1 &
light_pid=$!
"${PYTEST[@]}" -p xdist -n 2 --dist loadfile tests -m "not engine" --durations=15 || status=$?
light_status=0
wait "$light_pid" || light_status=$?
light_pid=""
cat "$phase_logs/engine-light.log"
[ "$status" -ne 0 ] || status=$light_status
"${PYTEST[@]}" tests -m "engine and slow" --durations=15 || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
exit "$status"
