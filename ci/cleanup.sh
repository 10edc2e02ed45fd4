#!/usr/bin/env bash
# Remove what a test or main-job run created: xla-images images and their build cache, stopped containers
# created from them, orphaned overlay2 directories, and the registry's data. Leaves the engine (restarted by the
# reap), the registry process and base images running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf 'cleanup: %s\n' "$*"; }

if docker info >/dev/null 2>&1; then
    # By id: an image pulled by digest has no tag (`<none>`), which is no name to remove it by.
    mapfile -t images < <(docker images --format '{{.Repository}} {{.ID}}' \
        | awk '$1 ~ /^(xla-images|127\.0\.0\.1:[0-9]+\/)/ && $1 !~ /^xla-images\/base$/ {print $2}' | sort -u || true)
    if [ "${#images[@]}" -gt 0 ]; then
        say "removing ${#images[@]} image(s)"
        docker rmi --force "${images[@]}" >/dev/null || true
    fi
    docker image prune --force >/dev/null
    # BuildKit keeps ~8 GB of cache per real flavour build; only --all frees what no image references.
    docker builder prune --all --force >/dev/null 2>&1 || true
    # And the overlay2 directories dockerd 26 orphans when a build exports a layer it already holds (engine.sh
    # explains): only on the engine ci/engine.sh started, which reap restarts.
    bash "$ROOT/ci/engine.sh" reap 2>&1 | sed 's/^/cleanup: /' || true
fi
bash "$ROOT/ci/registry.sh" wipe || true
df -h / | tail -1 | awk '{print "cleanup: disk free " $4}'
