"""What builds (classic or BuildKit) leave behind: cleaning it up once every build has stopped, and the build
cache."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import docker
import docker.errors

from ...errors import Failure
from . import connection, containers


class BuildAborted(Exception):
    """The build was cancelled from another thread (Ctrl-C / SIGTERM); the engine stops it on disconnect."""


@dataclass
class BuildTrace:
    """What one build touched, read off its output: enough to clean up after it and nothing more."""

    started: float = field(default_factory=time.time)
    # Short (12 hex) ids of every image a step produced or reused, in order; the first is the base.
    images: list[str] = field(default_factory=list)
    # Short ids of the containers the steps ran in ("Running in ..."; the engine removes them itself).
    containers: list[str] = field(default_factory=list)
    image_id: str | None = None


def remove_build_leftovers(traces: list[BuildTrace], keep: set[str], settle_seconds: float = 30) -> list[str]:
    """Remove what finished, failed or aborted builds left behind; return what was removed.

    Call it only when none of these builds is still running (their step containers would look leftover).
    Containers: those the builds' steps ran in or created from their images since they started (the engine
    removes them itself with forcerm, but an abort races with it). Images: the builds' own untagged images
    without children, i.e. a failed stage's last step or a finished stage not copied into the result;
    removing one also removes its untagged parents nobody else uses. Image ids in `keep` stay.
    """
    if not traces:
        return []
    removed = _remove_step_containers(traces, settle_seconds)
    dangling = {item["Id"] for item in connection.api().images(filters={"dangling": True})}
    keep_short = {short_id(image) for image in keep}
    for trace in traces:
        for short in reversed(trace.images):
            match = next((image for image in dangling if short_id(image) == short), None)
            if match is None or short in keep_short:
                continue
            with contextlib.suppress(docker.errors.NotFound):
                try:
                    connection.api().remove_image(match)
                    removed.append(f"image {short}")
                except docker.errors.APIError as error:
                    removed.append(f"image {short} kept: {connection.error_text(error)}")
            dangling.discard(match)
    return removed


def _remove_step_containers(traces: list[BuildTrace], settle_seconds: float) -> list[str]:
    since = min(trace.started for trace in traces) - 1
    images = {short for trace in traces for short in trace.images}
    named = {short for trace in traces for short in trace.containers}
    removed: list[str] = []
    deadline = time.monotonic() + settle_seconds
    while True:
        leftovers = [item for item in connection.api().containers(all=True)
                     if item["Created"] >= since
                     and (item["Id"][:12] in named or short_id(item.get("ImageID", "")) in images)]
        running = [item for item in leftovers if item.get("State") == "running"]
        # The engine kills an aborted step itself; give it a moment before forcing.
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for item in leftovers:
        containers.remove_container(item["Id"])
        removed.append(f"container {item['Id'][:12]}")
    # A removal the engine had already begun (409) ends a moment later; until then the container's image
    # cannot be removed, and would be left dangling.
    ids = {item["Id"] for item in leftovers}
    while ids and time.monotonic() < deadline + settle_seconds:
        ids &= {item["Id"] for item in connection.api().containers(all=True)}
        if ids:
            time.sleep(0.2)
    return removed


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def prune_build_cache() -> int:
    """Drop every build-cache record that no running build uses; return the bytes reclaimed.

    Images stay whole: their layers belong to the image store. What goes is BuildKit's copy of each stage, for a
    real flavour ~7.5 GB (the wheels stage's installed venv), which is kept otherwise until the engine's own
    garbage collection decides.
    """
    try:
        answer = connection.api().prune_builds(all=True)
    except docker.errors.APIError as error:
        raise Failure(f"cannot prune the engine's build cache: {connection.error_text(error)}",
                      rule="engine-prune") from None
    return int((answer or {}).get("SpaceReclaimed") or 0)
