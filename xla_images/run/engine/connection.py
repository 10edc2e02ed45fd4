"""The connection to the Docker engine (DOCKER_HOST, or the local socket), and how its errors read.

`client()` fails early with a hint when no engine answers; every other engine module goes through it.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import docker
import docker.errors

from ...errors import ConfigError, Failure, shorten


START_HINT = "start one with `ci/engine.sh start` (installs and runs dockerd), then check with `build.py doctor`"
LineSink = Callable[[str], None]


@functools.lru_cache(maxsize=1)
def client() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (default: the local unix socket).

    The API version is negotiated: the SDK may be newer than the engine (dockerd 20.10 speaks 1.41).
    """
    try:
        engine = docker.from_env(version="auto", timeout=600)
    except ValueError as error:  # the SDK parses DOCKER_HOST with urllib: a bad port, an unclosed [ ...
        raise ConfigError(f"DOCKER_HOST={shorten(os.environ.get('DOCKER_HOST', ''))!r} is not an engine "
                          f"address: {error}", location="DOCKER_HOST", rule="engine-host",
                          hint="unix:///var/run/docker.sock, tcp://HOST:PORT (port 1-65535) or ssh://USER@HOST; "
                               "unset it for the local socket") from None
    except (docker.errors.DockerException, OSError) as error:
        raise Failure(f"no Docker engine answers: {error_text(error)}", rule="engine-reachable",
                      hint=START_HINT) from None
    try:
        engine.ping()
    except (docker.errors.DockerException, OSError, ValueError) as error:
        raise Failure(f"no Docker engine answers: {error_text(error)}", rule="engine-reachable",
                      hint=START_HINT) from None
    return engine


def api() -> docker.APIClient:
    """The low-level client of `client()` (streaming builds, archives)."""
    return client().api


def engine_version() -> str:
    """`20.10.24+dfsg1 (API 1.41)`."""
    info = client().version()
    return f"{info.get('Version', '?')} (API {info.get('ApiVersion', '?')})"


def error_text(error: Exception) -> str:
    """What an SDK or HTTP error says, without its wrapping (the engine's own explanation when it gave one)."""
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


def engine_info() -> dict:
    """`docker info`: DockerRootDir, Driver, CgroupDriver, ServerVersion..."""
    return client().info()


CONTAINERD_SNAPSHOTTER = "io.containerd.snapshotter.v1"  # `docker info`'s driver-type under the containerd store


@functools.lru_cache(maxsize=1)
def image_store() -> str:
    """`containerd` when the engine keeps images in containerd's content store (dockerd's containerd-snapshotter
    feature), else `classic` (a graph driver such as overlay2).

    It decides what a build exports and who pushes: the containerd store keeps each layer as compressed blobs
    (BuildKit writes them in the site's compression, the engine pushes them as they are) and names an image by
    its manifest digest; the classic store keeps layers uncompressed, names an image by its config digest and
    pushes gzip only. Asked once per process: an engine changes store only when restarted.
    """
    status = engine_info().get("DriverStatus") or []
    kinds = {str(pair[1]) for pair in status if isinstance(pair, (list, tuple)) and len(pair) == 2
             and pair[0] == "driver-type"}
    return "containerd" if CONTAINERD_SNAPSHOTTER in kinds else "classic"
