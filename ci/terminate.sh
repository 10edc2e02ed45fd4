# shellcheck shell=bash
# Sourced by ci/engine.sh, ci/second-engine.sh and ci/registry.sh: stop a process they started.
#
#   terminate PID WHAT    TERM, wait up to $TIMEOUT seconds for it to exit, then KILL (saying so with `say`)

terminate() {
    local pid="$1" what="$2" waited=0
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge "$TIMEOUT" ]; then
            say "$what ignored TERM for ${TIMEOUT}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
}
