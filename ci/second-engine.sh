#!/usr/bin/env bash
# A second Docker engine on this host, reached over TCP with mutual TLS: the stand-in for a remote build host when
# the toolkit splits its work across engines (docs/engines.md).
#
#   ci/second-engine.sh start    make the TLS material (once), the /etc/hosts line, the bridge and its NAT rules,
#                                start dockerd on tcp://NAME:PORT (listening on 127.0.0.1 only, --tlsverify), wait
#                                until it answers, and create (or refresh) the docker context `xla-images-second`
#   ci/second-engine.sh stop     stop the dockerd this script started (TERM, wait, then KILL); the state, the
#                                context and the hosts line stay, so a later start reuses them
#   ci/second-engine.sh env      print the DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH lines that reach it
#                                (`eval "$(ci/second-engine.sh env)"`), or use DOCKER_CONTEXT=xla-images-second
#   ci/second-engine.sh status   say whether it answers; exit 0 if it does, 3 if not
#
# Why a name in /etc/hosts rather than 127.0.0.1: the client then checks the server certificate against a DNS
# name (its SAN), as it would for a real build host, and nothing treats the engine as "local".
# Why its own bridge and --iptables=false: two dockerds managing the same iptables chains and docker0 undo each
# other's rules (ci/engine.sh's header); this one gets a bridge of its own and the two NAT/FORWARD rules its
# build steps need to reach the network, added here by hand.
# The image store is containerd's, as ci/engine.sh starts the first engine with; its own data root and exec
# root, so it has its own managed containerd and image store: what it has, it pulled or built itself. The
# registry on 127.0.0.1:5000 is trusted as the first engine trusts it: dockerd speaks plain http to loopback
# registries without configuration.
#
# Every command is idempotent. State (pki/, client/, data/, exec/, pid file, log) lives under
# ${XLA_IMAGES_STATE:-/var/lib/xla-images}/second. Environment: XLA_IMAGES_STATE; SECOND_ENGINE_NAME (default
# xla-images-second.internal); SECOND_ENGINE_PORT (default 2376); SECOND_ENGINE_BRIDGE (default xla-second0) and
# SECOND_ENGINE_CIDR (default 172.31.254.1/24: the bridge's address, the containers' subnet); ENGINE_TIMEOUT
# (seconds to wait for start/stop, default 60).
set -euo pipefail

STATE_DIR="${XLA_IMAGES_STATE:-/var/lib/xla-images}/second"
NAME="${SECOND_ENGINE_NAME:-xla-images-second.internal}"
PORT="${SECOND_ENGINE_PORT:-2376}"
BRIDGE="${SECOND_ENGINE_BRIDGE:-xla-second0}"
CIDR="${SECOND_ENGINE_CIDR:-172.31.254.1/24}"
TIMEOUT="${ENGINE_TIMEOUT:-60}"
# shellcheck source=ci/daemon.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon.sh"
CONTEXT=xla-images-second
PKI="$STATE_DIR/pki"
CLIENT="$STATE_DIR/client"  # DOCKER_CERT_PATH: ca.pem, cert.pem, key.pem, as the docker CLI and SDK expect
PID_FILE="$STATE_DIR/dockerd.pid"
LOG_FILE="$STATE_DIR/dockerd.log"
HOSTS=/etc/hosts
HOSTS_MARK="# xla-images second engine"

say() { printf 'second engine: %s\n' "$*"; }
die() { printf 'second engine: error: %s\n' "$*" >&2; exit 1; }

case "$PORT" in '' | *[!0-9]*) die "SECOND_ENGINE_PORT must be a number, got '$PORT'" ;; esac
case "$NAME" in *[!A-Za-z0-9.-]* | '') die "SECOND_ENGINE_NAME must be a DNS name, got '$NAME'" ;; esac

need_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' needs root (run it with sudo)"
}

# The engine, asked the way every client will ask it: by name, over TLS, with the client certificate. The
# environment is set per call so an outer DOCKER_CONTEXT or DOCKER_HOST cannot point this script elsewhere.
sdocker() {
    DOCKER_CONTEXT='' DOCKER_HOST="tcp://$NAME:$PORT" DOCKER_TLS_VERIFY=1 DOCKER_CERT_PATH="$CLIENT" \
        timeout 30 docker "$@"
}

engine_answers() {
    [ -f "$CLIENT/cert.pem" ] && sdocker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}

make_pki() {
    # A CA of its own, a server certificate for NAME (and 127.0.0.1), a client certificate: made once, kept.
    if [ -f "$PKI/server.crt" ] && [ -f "$CLIENT/cert.pem" ] && openssl x509 -in "$PKI/server.crt" -noout \
        -checkend 86400 >/dev/null && openssl x509 -in "$PKI/server.crt" -noout -ext subjectAltName \
        | grep -q "DNS:$NAME\b"; then
        return 0
    fi
    say "making a CA, a server certificate for $NAME and a client certificate ($PKI)"
    mkdir -p "$PKI" "$CLIENT"
    chmod 700 "$PKI" "$CLIENT"
    (
        cd "$PKI"
        umask 077
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
            -subj "/CN=xla-images second engine CA" -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
        printf 'subjectAltName=DNS:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' \
            "$NAME" >server.ext
        printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n' >client.ext
        for leaf in server client; do
            openssl req -newkey rsa:2048 -nodes -keyout "$leaf.key" -out "$leaf.csr" \
                -subj "/CN=$([ "$leaf" = server ] && echo "$NAME" || echo xla-images-client)" 2>/dev/null
            openssl x509 -req -in "$leaf.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$leaf.crt" \
                -days 30 -extfile "$leaf.ext" 2>/dev/null
        done
    )
    install -m 0644 "$PKI/ca.crt" "$CLIENT/ca.pem"
    install -m 0644 "$PKI/client.crt" "$CLIENT/cert.pem"
    install -m 0600 "$PKI/client.key" "$CLIENT/key.pem"
}

add_host_line() {
    grep -q "^127\.0\.0\.1[[:space:]]\+${NAME}[[:space:]]" "$HOSTS" && return 0
    # Appended in place: /etc/hosts may be a bind mount, which a rename would not replace.
    printf '127.0.0.1 %s  %s\n' "$NAME" "$HOSTS_MARK" >>"$HOSTS"
    say "added '127.0.0.1 $NAME' to $HOSTS"
}

make_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$CIDR" dev "$BRIDGE"
        say "made bridge $BRIDGE ($CIDR)"
    fi
    ip link set "$BRIDGE" up
    local subnet
    subnet="$(subnet_of "$CIDR")"
    # What dockerd adds for docker0 when it manages iptables: masquerade the bridge's traffic out of the host,
    # and let it through FORWARD both ways. -C first: each rule once, whatever number of starts.
    iptables -t nat -C POSTROUTING -s "$subnet" ! -o "$BRIDGE" -j MASQUERADE 2>/dev/null \
        || iptables -t nat -A POSTROUTING -s "$subnet" ! -o "$BRIDGE" -j MASQUERADE
    iptables -C FORWARD -i "$BRIDGE" -j ACCEPT 2>/dev/null || iptables -I FORWARD -i "$BRIDGE" -j ACCEPT
    iptables -C FORWARD -o "$BRIDGE" -j ACCEPT 2>/dev/null || iptables -I FORWARD -o "$BRIDGE" -j ACCEPT
    sysctl -q -w net.ipv4.ip_forward=1 >/dev/null || true
}

subnet_of() {
    # 172.31.254.1/24 -> 172.31.254.0/24 (the prefixes this script is given are /8, /16 or /24).
    local address="${1%/*}" bits="${1#*/}" a b c _d
    IFS=. read -r a b c _d <<<"$address"
    case "$bits" in
        8) echo "$a.0.0.0/8" ;;
        16) echo "$a.$b.0.0/16" ;;
        24) echo "$a.$b.$c.0/24" ;;
        *) die "SECOND_ENGINE_CIDR must be a /8, /16 or /24 address, got '$1'" ;;
    esac
}

make_context() {
    local endpoint="host=tcp://$NAME:$PORT,ca=$CLIENT/ca.pem,cert=$CLIENT/cert.pem,key=$CLIENT/key.pem"
    # The CLI copies the TLS files into ~/.docker/contexts/tls: update refreshes them when they were remade.
    if DOCKER_CONTEXT='' DOCKER_HOST='' docker context inspect "$CONTEXT" >/dev/null 2>&1; then
        DOCKER_CONTEXT='' DOCKER_HOST='' docker context update "$CONTEXT" --docker "$endpoint" >/dev/null 2>&1 \
            || die "docker context update $CONTEXT failed"
    else
        DOCKER_CONTEXT='' DOCKER_HOST='' docker context create "$CONTEXT" \
            --description "xla-images second engine (ci/second-engine.sh)" --docker "$endpoint" >/dev/null 2>&1 \
            || die "docker context create $CONTEXT failed"
        say "created docker context $CONTEXT"
    fi
}

start() {
    need_root start
    command -v dockerd >/dev/null || die "dockerd is not installed; run: ci/engine.sh install"
    mkdir -p "$STATE_DIR"
    make_pki
    add_host_line
    make_context
    if engine_answers; then
        say "already running at tcp://$NAME:$PORT: $(sdocker info --format 'dockerd {{.ServerVersion}}, root {{.DockerRootDir}}')"
        return 0
    fi
    if our_pid >/dev/null; then die "dockerd (pid $(cat "$PID_FILE")) runs but does not answer; see $LOG_FILE, then stop it"; fi
    make_bridge
    printf '{"features": {"containerd-snapshotter": true}}\n' >"$STATE_DIR/daemon.json"
    say "starting dockerd on tcp://$NAME:$PORT (127.0.0.1 only, mutual TLS; log: $LOG_FILE)"
    local began
    began="$(date +%s.%N)"
    setsid nohup dockerd \
        --config-file "$STATE_DIR/daemon.json" \
        --host "tcp://127.0.0.1:$PORT" \
        --tlsverify --tlscacert "$PKI/ca.crt" --tlscert "$PKI/server.crt" --tlskey "$PKI/server.key" \
        --data-root "$STATE_DIR/data" --exec-root "$STATE_DIR/exec" --pidfile "$PID_FILE" \
        --bridge "$BRIDGE" --iptables=false --ip-masq=false --ip 127.0.0.1 \
        --storage-driver overlayfs --exec-opt native.cgroupdriver=cgroupfs \
        >>"$LOG_FILE" 2>&1 </dev/null &
    await_answer $! dockerd engine_answers
    say "running: $(sdocker info --format 'dockerd {{.ServerVersion}}') after $(awk -v b="$began" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - b }')s; docker context $CONTEXT"
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        say "not running (or not started by this script: $PID_FILE)"
        return 0
    fi
    need_root stop
    say "stopping dockerd (pid $pid)"
    terminate "$pid" "dockerd"
    rm -f "$PID_FILE"
    say "stopped"
}

env_lines() {
    [ -f "$CLIENT/cert.pem" ] || die "no client certificate yet ($CLIENT); run: ci/second-engine.sh start"
    printf 'export DOCKER_HOST=tcp://%s:%s\nexport DOCKER_TLS_VERIFY=1\nexport DOCKER_CERT_PATH=%s\n' \
        "$NAME" "$PORT" "$CLIENT"
}

status() {
    if engine_answers; then
        say "running at tcp://$NAME:$PORT: $(sdocker info --format 'dockerd {{.ServerVersion}}, storage {{.Driver}}, root {{.DockerRootDir}}') (pid: $(our_pid || echo 'not started by this script'))"
        return 0
    fi
    say "not running (start it with: ci/second-engine.sh start)"
    return 3
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) env_lines ;;
    status) status ;;
    *) echo "usage: $0 {start|stop|env|status}" >&2; exit 2 ;;
esac
