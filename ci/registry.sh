#!/usr/bin/env bash
# Run a local image registry (Debian's docker-registry) for xla-images tests and local publishing.
#
#   ci/registry.sh install   install the docker-registry package (apt-get update runs once, only if needed)
#   ci/registry.sh start     start `docker-registry serve` on 127.0.0.1:$PORT in the background; wait for /v2/
#   ci/registry.sh stop      stop it (TERM, wait, then KILL)
#   ci/registry.sh status    say whether it answers; exit 0 if it does, 3 if not
#   ci/registry.sh wipe      delete every stored image (stops the registry first, restarts it if it was running)
#
# Every command is idempotent. One registry per port; its config, data, pid file and log live under
# ${XLA_IMAGES_STATE:-/var/lib/xla-images}/registry/$PORT/. Environment: XLA_IMAGES_STATE, PORT (default 5000),
# REGISTRY_TIMEOUT (seconds to wait for start/stop, default 30).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${XLA_IMAGES_STATE:-/var/lib/xla-images}"
PORT="${PORT:-5000}"
TIMEOUT="${REGISTRY_TIMEOUT:-30}"
DIR="$STATE_DIR/registry/$PORT"
CONFIG="$DIR/config.yml"
DATA="$DIR/data"
PID_FILE="$DIR/registry.pid"
LOG_FILE="$DIR/registry.log"
URL="http://127.0.0.1:$PORT/v2/"

say() { printf 'registry %s: %s\n' "$PORT" "$*"; }
die() { printf 'registry %s: error: %s\n' "$PORT" "$*" >&2; exit 1; }

case "$PORT" in
    '' | *[!0-9]*) die "PORT must be a number, got '$PORT'" ;;
esac

answers() {
    curl --silent --fail --max-time 2 --output /dev/null "$URL"
}

our_pid() {
    [ -f "$PID_FILE" ] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

install() {
    if dpkg-query -W -f='${Status}' docker-registry 2>/dev/null | grep -q 'install ok installed'; then
        say "docker-registry already installed"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "install needs root (run it with sudo)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry
}

write_config() {
    mkdir -p "$DATA"
    sed -e "s|@PORT@|$PORT|g" -e "s|@DATA@|$DATA|g" "$HERE/registry.yml.tmpl" >"$CONFIG.tmp"
    mv "$CONFIG.tmp" "$CONFIG"
}

start() {
    if our_pid >/dev/null && answers; then
        say "already running at $URL"
        return 0
    fi
    if answers; then
        say "a registry not started by this script already answers at $URL; using it"
        return 0
    fi
    command -v docker-registry >/dev/null || die "docker-registry is not installed; run: ci/registry.sh install"
    write_config
    say "starting (data: $DATA, log: $LOG_FILE)"
    setsid nohup docker-registry serve "$CONFIG" >>"$LOG_FILE" 2>&1 </dev/null &
    local pid=$! waited=0
    echo "$pid" >"$PID_FILE"
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$LOG_FILE" >&2 || true
            rm -f "$PID_FILE"
            die "docker-registry exited during start-up (log above, full log: $LOG_FILE)"
        fi
        if [ "$waited" -ge "$TIMEOUT" ]; then
            die "no answer from $URL within ${TIMEOUT}s (log: $LOG_FILE)"
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    say "running at $URL (pid $pid)"
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        rm -f "$PID_FILE"
        say "not running"
        return 0
    fi
    kill -TERM "$pid"
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge "$TIMEOUT" ]; then
            say "ignored TERM for ${TIMEOUT}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
    rm -f "$PID_FILE"
    say "stopped (pid $pid)"
}

status() {
    if answers; then
        say "running at $URL (pid: $(our_pid || echo 'not started by this script'), data: $DATA)"
        return 0
    fi
    say "not running (start it with: ci/registry.sh start)"
    return 3
}

wipe() {
    local was_running=false
    if our_pid >/dev/null; then
        was_running=true
        stop
    fi
    rm -rf "$DATA"
    say "wiped $DATA"
    if [ "$was_running" = true ]; then
        start
    fi
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    wipe) wipe ;;
    *) echo "usage: $0 {install|start|stop|status|wipe}" >&2; exit 2 ;;
esac
