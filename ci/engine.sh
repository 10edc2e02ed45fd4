#!/usr/bin/env bash
# Run a Docker engine for xla-images on a host without systemd (CI runners, containers, dev VMs).
#
#   ci/engine.sh install   install the Debian packages the toolkit needs: a BuildKit-capable engine
#                          (docker.io 26 + docker-buildx, and cosign, pinned one by one from Debian 13
#                          through the same mirror: Debian 12's docker.io 20.10 is end of life and has no
#                          buildx), docker-registry, debootstrap, the shellcheck linter, libpython3.11 for
#                          torch_xla on the host, pigz (dockerd's parallel gzip) and zstd (zstd pushes), and
#                          containerd 1.7 from Debian 13 (dockerd's containerd image store needs 1.7; Debian 12 has
#                          1.6); apt-get update runs only if something is missing.
#                          An engine the user already has (Docker CE 24+ with buildx) is left alone:
#                          ENGINE_FROM_TRIXIE=0 installs only the rest.
#   ci/engine.sh start     start dockerd in the background (cgroupfs, unix socket only) with the image store
#                          ENGINE_IMAGE_STORE names, and wait until `docker info` answers
#   ci/engine.sh stop      stop the dockerd this script started (TERM, wait, then KILL)
#   ci/engine.sh status    say whether an engine answers; exit 0 if it does, 3 if not
#   ci/engine.sh reap      free the overlay2 directories dockerd 26 orphans (below): empties the build cache, stops
#                          the dockerd this script started, removes what its layer store does not name, starts it.
#                          On the containerd image store there are none: it only empties the build cache.
#
# The image store: `containerd` (the default) keeps images in containerd's content store, each layer as the
# compressed blob a build exported or a pull fetched, and unpacks them with its overlayfs snapshotter. Builds then
# write layers in the site's compression (zstd by default) and the engine pushes those blobs as they are; a cold
# pull of the 7.65 GB torch_xla 2.9 image took 0.61x the time of its gzip on the same store, and 0.46x that of gzip
# on the classic store without unpigz, here (docs/pulls.md). `classic` is dockerd's graph-driver store (overlay2),
# which most installed engines still use: the toolkit supports both. Switching stores hides the other store's
# images (they stay on disk) until switched back.
#
# Why reap: with BuildKit on the overlay2 graph driver, every layer a build exports that the image store already
# holds (a rebuild of the same flavour, the cpu and tpu flavours' shared layers, a reproducibility check) leaves
# its build snapshot behind, referenced by no image and freed by no prune (docker/buildx#2061, moby/moby#45939):
# ~7 GB per real flavour. Once the build cache is empty, the layer store (layerdb) names every directory in use,
# with the `lower` chains of those directories: a layer built on such a copy still reads through it.
#
# Every command is idempotent. State (pid file, log) lives under ${XLA_IMAGES_STATE:-/var/lib/xla-images}.
# Environment: XLA_IMAGES_STATE; ENGINE_TIMEOUT (seconds to wait for start/stop, default 60); ENGINE_IMAGE_STORE
# (containerd, the default, or classic: written to $XLA_IMAGES_STATE/daemon.json as dockerd's containerd-snapshotter
# feature, unless ENGINE_DOCKERD_ARGS names a --config-file of its own); ENGINE_STORAGE_DRIVER (default: overlayfs,
# containerd's snapshotter, on the containerd store, overlay2 on the classic one); DOCKER_HOST
# (a unix:// socket, default unix:///var/run/docker.sock); ENGINE_DOCKERD_ARGS (extra dockerd options, e.g.
# a second engine beside the first, with XLA_IMAGES_STATE and DOCKER_HOST of its own: "--data-root DIR --exec-root
# DIR --bridge BR --iptables=false" with BR a bridge of its own made first with `ip link add BR type bridge`. Not
# `--pidfile` (this script keeps its own under XLA_IMAGES_STATE: stop and reap find the engine by it), and not
# `--bridge none`: a dockerd started with it deleted the host's docker0 here, and the first engine's containers and
# builds then failed with "adding interface ... to bridge docker0 failed: Device does not exist").
set -euo pipefail

STATE_DIR="${XLA_IMAGES_STATE:-/var/lib/xla-images}"
PID_FILE="$STATE_DIR/dockerd.pid"
LOG_FILE="$STATE_DIR/dockerd.log"
SOCKET="${DOCKER_HOST:-unix:///var/run/docker.sock}"
TIMEOUT="${ENGINE_TIMEOUT:-60}"
# shellcheck source=ci/daemon.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon.sh"
IMAGE_STORE="${ENGINE_IMAGE_STORE:-containerd}"
DAEMON_CONFIG="$STATE_DIR/daemon.json"
# pigz: dockerd decompresses gzip layers through `unpigz` when it is on PATH (cold pull of the 7.65 GB torch_xla 2.9
# image: 74-76 s without, 49 s with); zstd: compresses the layers of a zstd push (model/compression.py).
PACKAGES=(docker-registry debootstrap shellcheck libpython3.11 pigz zstd)
# Exact versions: only these come from Debian 13; everything else (runc, libc) stays Debian 12's.
TRIXIE_PACKAGES=(docker.io=26.1.5+dfsg1-9+deb13u1+b1 docker-buildx=0.13.1+ds1-3 cosign=2.5.0-2+b5
                 containerd=1.7.24~ds1-6+deb13u1)
TRIXIE_SOURCE=/etc/apt/sources.list.d/xla-images-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/xla-images-trixie

case "$SOCKET" in
    unix://*) ;;
    *) printf 'engine: error: DOCKER_HOST must be a unix:// socket (the engine never listens on TCP)\n' >&2; exit 2 ;;
esac
case "$IMAGE_STORE" in
    containerd) DEFAULT_DRIVER=overlayfs ;;
    classic) DEFAULT_DRIVER=overlay2 ;;
    *) printf 'engine: error: ENGINE_IMAGE_STORE=%s: the image store is containerd or classic\n' "$IMAGE_STORE" >&2; exit 2 ;;
esac
export DOCKER_HOST="$SOCKET"
read -r -a EXTRA_ARGS <<<"${ENGINE_DOCKERD_ARGS:-}"

say() { printf 'engine: %s\n' "$*"; }
die() { printf 'engine: error: %s\n' "$*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "'$1' needs root (run it with sudo)"
}

engine_answers() {
    docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}

store_of_engine() {
    # What the answering engine keeps images in: its driver status names containerd's snapshotter, or not.
    if docker info --format '{{json .DriverStatus}}' | grep -q 'io.containerd.snapshotter.v1'; then
        echo containerd
    else
        echo classic
    fi
}

config_args() {
    # The store as dockerd's feature flag, in a config file of ours, unless the caller brings its own.
    local arg
    for arg in "${EXTRA_ARGS[@]}"; do
        case "$arg" in --config-file|--config-file=*) return 0 ;; esac
    done
    local wanted=false
    [ "$IMAGE_STORE" = containerd ] && wanted=true
    printf '{"features": {"containerd-snapshotter": %s}}\n' "$wanted" >"$DAEMON_CONFIG"
    printf '%s\n' --config-file "$DAEMON_CONFIG"
}

missing_packages() {
    local package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || echo "$package"
    done
}

missing_versions() {
    # NAME=VERSION entries whose exact version is not installed.
    local entry name version
    for entry in "$@"; do
        name="${entry%%=*}"
        version="${entry#*=}"
        [ "$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null)" = "install ok installed $version" ] \
            || echo "$entry"
    done
}

add_trixie_source() {
    # Debian 13 as a source of last resort (priority 100: never chosen unless asked for by version), so that
    # the pinned packages above, and nothing else, come from it.
    [ -f "$TRIXIE_SOURCE" ] && [ -f "$TRIXIE_PIN" ] && return 1
    cat >"$TRIXIE_SOURCE" <<'SOURCE'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCE
    cat >"$TRIXIE_PIN" <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
}

engine_wanted() {
    # Leave a user's own engine alone: a dockerd that is not Debian's and already has buildx.
    [ "${ENGINE_FROM_TRIXIE:-1}" = 1 ] || return 1
    if command -v dockerd >/dev/null && ! dpkg-query -W docker.io >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; then
        say "keeping the installed engine ($(dockerd --version)) and its buildx"
        return 1
    fi
    return 0
}

install_packages() {
    local missing=()
    mapfile -t missing < <(missing_packages "$@")
    if engine_wanted; then
        local from_trixie
        mapfile -t from_trixie < <(missing_versions "${TRIXIE_PACKAGES[@]}")
        if [ "${#from_trixie[@]}" -gt 0 ]; then
            need_root install
            if add_trixie_source; then say "added Debian 13 as a pinned source ($TRIXIE_SOURCE, $TRIXIE_PIN)"; fi
        fi
        missing+=("${from_trixie[@]}")
    fi
    if [ "${#missing[@]}" -eq 0 ]; then
        say "packages already installed: $* ${TRIXIE_PACKAGES[*]}"
        return 0
    fi
    need_root install
    say "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    say "installed: $(dockerd --version 2>/dev/null || echo 'no dockerd'); $(docker buildx version 2>/dev/null || echo 'no buildx')"
}

start() {
    if engine_answers; then
        local running
        running="$(store_of_engine)"
        say "already running: $(docker info --format 'dockerd {{.ServerVersion}}, storage {{.Driver}}, cgroup {{.CgroupDriver}}') ($running image store)"
        if [ "$running" != "$IMAGE_STORE" ]; then
            say "note: ENGINE_IMAGE_STORE=$IMAGE_STORE, but this engine uses the $running store; stop it first to switch"
        fi
        return 0
    fi
    need_root start
    command -v dockerd >/dev/null || die "dockerd is not installed; run: ci/engine.sh install"
    mkdir -p "$STATE_DIR"
    local config=()
    mapfile -t config < <(config_args)
    say "starting dockerd, $IMAGE_STORE image store (log: $LOG_FILE)"
    # Only the unix socket: no TCP listener. Published container ports default to loopback too.
    setsid nohup dockerd \
        --host "$SOCKET" \
        --storage-driver "${ENGINE_STORAGE_DRIVER:-$DEFAULT_DRIVER}" \
        --exec-opt native.cgroupdriver=cgroupfs \
        --ip 127.0.0.1 \
        --pidfile "$PID_FILE" \
        "${config[@]}" \
        "${EXTRA_ARGS[@]}" \
        >>"$LOG_FILE" 2>&1 </dev/null &
    local began=$SECONDS
    await_answer $! dockerd engine_answers
    say "running: $(docker info --format 'dockerd {{.ServerVersion}}') after $((SECONDS - began))s"
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        if engine_answers; then
            say "an engine answers, but not one this script started ($PID_FILE); leaving it alone"
        else
            say "not running"
        fi
        return 0
    fi
    need_root stop
    say "stopping dockerd (pid $pid)"
    terminate "$pid" "dockerd"
    rm -f "$PID_FILE"
    say "stopped"
}

status() {
    if engine_answers; then
        local pid
        pid="$(our_pid || echo 'not started by this script')"
        say "running: $(docker info --format 'dockerd {{.ServerVersion}}, storage {{.Driver}}, root {{.DockerRootDir}}'), $(store_of_engine) image store (pid: $pid)"
        return 0
    fi
    say "not running (start it with: ci/engine.sh start)"
    return 3
}

reap() {
    our_pid >/dev/null || die "reap works only on the dockerd this script started ($PID_FILE); it stops it for a moment"
    need_root reap
    if [ "$(store_of_engine)" = containerd ]; then
        # containerd's garbage collector frees a snapshot with the last image or build record that uses it.
        docker builder prune --all --force >/dev/null
        say "the containerd image store orphans no layer directories; emptied the build cache"
        return 0
    fi
    [ "$(docker info --format '{{.Driver}}')" = overlay2 ] || die "reap knows the overlay2 storage driver only"
    # Restarted below as it runs now, whatever ENGINE_IMAGE_STORE says in this shell.
    IMAGE_STORE=classic
    DEFAULT_DRIVER=overlay2
    [ -z "$(docker ps --quiet)" ] || die "containers are running; reap stops the engine, so run it when they are done"
    docker builder prune --all --force >/dev/null
    local cache
    cache="$(docker system df --format '{{.Type}}={{.TotalCount}}' | sed -n 's/^Build Cache=//p')"
    [ "$cache" = 0 ] || die "the build cache still holds $cache record(s) (a build is running?); try again after it"
    local root
    root="$(docker info --format '{{.DockerRootDir}}')"
    stop
    trap start EXIT  # whatever goes wrong below, the engine comes back
    local layerdb="$root/image/overlay2/layerdb" dir name bytes count=0 freed=0
    # In use: what the layer store names (layers, container mounts and init layers), and every directory in
    # their `lower` chains — a layer BuildKit stacked on an orphaned copy (the tpu flavour's libtpu on the copies
    # of the layers it shares with cpu) reads through that copy, whatever the layer store thinks.
    declare -A by_link=() keep=()
    for dir in "$root"/overlay2/*; do
        if [ -f "$dir/link" ]; then by_link["$(cat "$dir/link")"]="$(basename "$dir")"; fi
    done
    local queue=() lowers short
    # awk, not cat: these files end without a newline, and the names must stay one a line.
    mapfile -t queue < <(awk 1 "$layerdb"/sha256/*/cache-id "$layerdb"/mounts/*/mount-id \
        "$layerdb"/mounts/*/init-id 2>/dev/null || true)
    while [ "${#queue[@]}" -gt 0 ]; do
        name="${queue[0]}"
        queue=("${queue[@]:1}")
        if [ -z "$name" ] || [ -n "${keep[$name]:-}" ]; then continue; fi
        keep["$name"]=1
        [ -f "$root/overlay2/$name/lower" ] || continue
        IFS=: read -r -a lowers <"$root/overlay2/$name/lower" || true  # no newline at its end: read says 1
        for short in "${lowers[@]}"; do
            short="${short#l/}"
            [ -n "${by_link[$short]:-}" ] || die "cannot tell which directory l/$short (below $name) is; nothing removed"
            queue+=("${by_link[$short]}")
        done
    done
    for dir in "$root"/overlay2/*; do
        name="$(basename "$dir")"
        if [ "$name" = l ] || [ -n "${keep[$name]:-}" ]; then continue; fi
        bytes="$(du --summarize --bytes "$dir" | cut -f1)"
        rm -rf -- "$dir"
        count=$((count + 1))
        freed=$((freed + bytes))
    done
    find "$root/overlay2/l" -xtype l -delete  # the short-name links of what went
    trap - EXIT
    start
    say "reaped $count orphaned overlay2 director$([ "$count" = 1 ] && echo y || echo ies), $((freed / 1000000)) MB"
}

case "${1:-}" in
    install) install_packages "${PACKAGES[@]}" ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    reap) reap ;;
    *) echo "usage: $0 {install|start|stop|status|reap}" >&2; exit 2 ;;
esac
