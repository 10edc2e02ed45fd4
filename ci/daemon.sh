# shellcheck shell=bash
# Sourced by ci/engine.sh, ci/second-engine.sh and ci/registry.sh: wait for a daemon they started to answer, and
# stop it. They read $TIMEOUT (seconds), $LOG_FILE and $PID_FILE, and call the sourcing script's `say` and `die`.
#
#   our_pid                       print the pid in $PID_FILE if that process is alive; fail otherwise
#   await_answer PID WHAT CHECK   run CHECK every half second until it succeeds; if PID exits first, or TIMEOUT
#                                 seconds pass, print the log's last lines and die saying which
#   terminate PID WHAT            TERM, wait up to $TIMEOUT seconds for it to exit, then KILL (saying so)

our_pid() {
    [ -f "$PID_FILE" ] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

await_answer() {
    local pid="$1" what="$2" check="$3" deadline=$((SECONDS + TIMEOUT))
    until "$check"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$LOG_FILE" >&2 || true
            die "$what exited during start-up (log above, full log: $LOG_FILE)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 20 "$LOG_FILE" >&2 || true
            die "$what did not answer within ${TIMEOUT}s (log above, full log: $LOG_FILE)"
        fi
        sleep 0.5
    done
}

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
