#!/usr/bin/env bash
# Run a local image registry (Debian's docker-registry) for xla-images tests and local publishing.
#
#   ci/registry.sh install   install the docker-registry package (apt-get update runs once, only if needed)
#   ci/registry.sh start     start `docker-registry serve` on 127.0.0.1:$PORT in the background; wait for /v2/
#   ci/registry.sh stop      stop it (TERM, wait, then KILL)
#   ci/registry.sh status    say whether it answers; exit 0 if it does, 3 if not
#   ci/registry.sh wipe      delete every stored image (stops the registry first, restarts it if it was running)
#   ci/registry.sh start-mirror
#                            start a pull-through cache of the registry ORIGIN names (distribution's proxy mode):
#                            every blob and manifest it serves by digest is fetched from the origin once, then
#                            from its own disk. It refuses pushes. stop, status and wipe work on it as on any.
#
# Every command is idempotent. One registry per port; its config, data, pid file and log live under
# ${XLA_IMAGES_STATE:-/var/lib/xla-images}/registry/$PORT/. Environment: XLA_IMAGES_STATE, PORT (default 5000),
# REGISTRY_TIMEOUT (seconds to wait for start/stop, default 30). Every registry listens on 127.0.0.1 only.
#
# start-mirror reads (docs/mirror.md tells how a zone runs one):
#   ORIGIN           the origin registry, https://HOST[:PORT] (http:// only for a loopback origin); required
#   ORIGIN_USER      the user the mirror reads the origin as, with ORIGIN_PASSWORD (both or neither); they reach
#   ORIGIN_PASSWORD  the registry process through its environment only: never in the config, a log or the output
#   ORIGIN_CA        a PEM file of the CA that signed the origin's certificate, trusted besides the system store
#                    (SSL_CERT_FILE, when set, is the system store); optional
# The origin must answer when the mirror starts (distribution asks it for its auth challenge then); a mirror that
# already runs for the same ORIGIN is left alone, one for another origin (or a plain registry) on PORT is an error.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${XLA_IMAGES_STATE:-/var/lib/xla-images}"
PORT="${PORT:-5000}"
TIMEOUT="${REGISTRY_TIMEOUT:-30}"
# shellcheck source=ci/daemon.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon.sh"
DIR="$STATE_DIR/registry/$PORT"
CONFIG="$DIR/config.yml"
DATA="$DIR/data"
PID_FILE="$DIR/registry.pid"
LOG_FILE="$DIR/registry.log"
# A mirror's origin URL (no secret); its presence marks the port's registry as a mirror.
ORIGIN_FILE="$DIR/origin"
ORIGIN_BUNDLE="$DIR/origin-ca.pem"
URL="http://127.0.0.1:$PORT/v2/"

say() { printf 'registry %s: %s\n' "$PORT" "$*"; }
die() { printf 'registry %s: error: %s\n' "$PORT" "$*" >&2; exit 1; }

case "$PORT" in
    '' | *[!0-9]*) die "PORT must be a number, got '$PORT'" ;;
esac

answers() {
    curl --silent --fail --max-time 2 --output /dev/null "$URL"
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
    rm -f "$ORIGIN_FILE" "$ORIGIN_BUNDLE"
    launch
}

# Start `docker-registry serve $CONFIG` in the background (with the environment the caller exported for it) and
# wait until /v2/ answers.
launch() {
    say "starting (data: $DATA, log: $LOG_FILE)"
    setsid nohup docker-registry serve "$CONFIG" >>"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    await_answer "$pid" "docker-registry at $URL" answers
    say "running at $URL (pid $pid)"
}

# --- the pull-through cache ----------------------------------------------------------------------------------

check_origin() {
    [ -n "${ORIGIN:-}" ] || die "ORIGIN is not set: start-mirror needs the origin registry," \
        "e.g. ORIGIN=https://registry.example:5000"
    ORIGIN="${ORIGIN%/}"
    case "$ORIGIN" in
        *@*) die "ORIGIN must not hold credentials; pass them as ORIGIN_USER and ORIGIN_PASSWORD" ;;
    esac
    # Scheme, a host name of letters, digits, dots and hyphens (or a bracketed IPv6), an optional port, no path.
    local shape='^https?://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$'
    if ! printf '%s' "$ORIGIN" | grep -Eq "$shape"; then
        die "ORIGIN must be https://HOST[:PORT] (no path), got '$ORIGIN'"
    fi
    case "$ORIGIN" in
        http://127.* | http://localhost | http://localhost:* | http://\[::1\]*) ;;
        http://*) die "ORIGIN must be https:// (plain http is for a loopback origin only): '$ORIGIN'" ;;
    esac
    if [ -n "${ORIGIN_USER:-}" ] && [ -z "${ORIGIN_PASSWORD:-}" ]; then
        die "ORIGIN_USER is set but ORIGIN_PASSWORD is not: set both, or neither for an anonymous origin"
    fi
    if [ -z "${ORIGIN_USER:-}" ] && [ -n "${ORIGIN_PASSWORD:-}" ]; then
        die "ORIGIN_PASSWORD is set but ORIGIN_USER is not: set both, or neither for an anonymous origin"
    fi
    if [ -n "${ORIGIN_CA:-}" ]; then
        if [ ! -f "$ORIGIN_CA" ] || [ ! -r "$ORIGIN_CA" ]; then die "ORIGIN_CA=$ORIGIN_CA is not a readable file"; fi
        grep -q -- '-----BEGIN CERTIFICATE-----' "$ORIGIN_CA" || die "ORIGIN_CA=$ORIGIN_CA holds no PEM certificate"
    fi
}

write_mirror_config() {
    write_config
    # The proxy section carries the origin's URL only: distribution reads the user and password from
    # REGISTRY_PROXY_USERNAME/REGISTRY_PROXY_PASSWORD, which only the registry process is given.
    {
        printf '# A pull-through cache of the origin (ci/registry.sh start-mirror); it refuses pushes.\n'
        printf 'proxy:\n  remoteurl: %s\n' "$ORIGIN"
    } >>"$CONFIG"
    printf '%s\n' "$ORIGIN" >"$ORIGIN_FILE.tmp"
    mv "$ORIGIN_FILE.tmp" "$ORIGIN_FILE"
}

# The CAs the registry process trusts for the origin: the system store (or the bundle SSL_CERT_FILE names)
# plus ORIGIN_CA. Go's TLS reads SSL_CERT_FILE, so that is how the bundle reaches it.
write_origin_bundle() {
    rm -f "$ORIGIN_BUNDLE"
    [ -n "${ORIGIN_CA:-}" ] || return 0
    local system="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
    {
        if [ -f "$system" ]; then cat "$system"; fi
        printf '\n'
        cat "$ORIGIN_CA"
    } >"$ORIGIN_BUNDLE.tmp"
    mv "$ORIGIN_BUNDLE.tmp" "$ORIGIN_BUNDLE"
}

# distribution 2.8's proxy answers only a Bearer (token) challenge of the origin: against a Basic-auth origin
# (htpasswd) every fetch fails with "authentication required". Ask the origin's /v2/ first and say so.
check_origin_auth() {
    local headers status
    local ca=()
    if [ -f "$ORIGIN_BUNDLE" ]; then ca=(--cacert "$ORIGIN_BUNDLE"); fi
    if ! headers="$(curl --silent --show-error --max-time 10 --output /dev/null --dump-header - "${ca[@]}" \
                        "$ORIGIN/v2/" 2>&1)"; then
        die "the origin does not answer at $ORIGIN/v2/ (${headers##*curl: });" \
            "the mirror asks it for its auth challenge when it starts"
    fi
    status="$(printf '%s\n' "$headers" | awk 'NR == 1 {print $2}')"
    if [ "$status" = 401 ] && printf '%s\n' "$headers" | grep -iq '^www-authenticate: *basic'; then
        die "the origin asks for Basic auth (htpasswd), which distribution 2.8's proxy does not answer;" \
            "the origin must allow anonymous reads or use token auth (a Bearer realm)"
    fi
    if [ -n "${ORIGIN_USER:-}" ] && [ "$status" != 401 ]; then
        say "note: the origin answered $status to /v2/ without credentials; ORIGIN_USER will only be used if it asks"
    fi
}

start_mirror() {
    check_origin
    if our_pid >/dev/null && answers; then
        if [ -f "$ORIGIN_FILE" ] && [ "$(cat "$ORIGIN_FILE")" = "$ORIGIN" ]; then
            say "mirror of $ORIGIN already running at $URL"
            return 0
        fi
        local running
        running="$(cat "$ORIGIN_FILE" 2>/dev/null || echo 'none, a plain registry')"
        die "the registry at $URL is not a mirror of $ORIGIN (its origin: $running); stop it first or pick another PORT"
    fi
    if answers; then
        die "a registry not started by this script already answers at $URL; pick another PORT for the mirror"
    fi
    command -v docker-registry >/dev/null || die "docker-registry is not installed; run: ci/registry.sh install"
    mkdir -p "$DIR"
    write_origin_bundle
    check_origin_auth
    write_mirror_config
    say "mirror of $ORIGIN${ORIGIN_USER:+ (as user $ORIGIN_USER)}${ORIGIN_CA:+, trusting the CA in $ORIGIN_CA}"
    (
        # Only for the registry process: the shell that called us keeps its own environment.
        if [ -n "${ORIGIN_USER:-}" ]; then
            export REGISTRY_PROXY_USERNAME="$ORIGIN_USER" REGISTRY_PROXY_PASSWORD="$ORIGIN_PASSWORD"
        fi
        if [ -f "$ORIGIN_BUNDLE" ]; then
            export SSL_CERT_FILE="$ORIGIN_BUNDLE"
        fi
        unset ORIGIN_PASSWORD
        launch
    )
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        rm -f "$PID_FILE"
        say "not running"
        return 0
    fi
    terminate "$pid" "the registry"
    rm -f "$PID_FILE"
    say "stopped (pid $pid)"
}

status() {
    if answers; then
        local mirror=""
        if our_pid >/dev/null && [ -f "$ORIGIN_FILE" ]; then mirror=", mirror of $(cat "$ORIGIN_FILE")"; fi
        say "running at $URL (pid: $(our_pid || echo 'not started by this script'), data: $DATA$mirror)"
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
        if [ -f "$ORIGIN_FILE" ]; then
            # A mirror restarts as the mirror of the same origin; credentials and CA come from the environment again.
            ORIGIN="${ORIGIN:-$(cat "$ORIGIN_FILE")}" start_mirror
        else
            start
        fi
    fi
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    wipe) wipe ;;
    start-mirror) start_mirror ;;
    *) echo "usage: $0 {install|start|stop|status|wipe|start-mirror}" >&2; exit 2 ;;
esac
