"""The Docker engine, through the docker SDK. The ONLY module that imports `docker`.

Everything else speaks in image references, ids, labels and paths; engine errors a user can cause (no
engine, missing image) become `Failure`s with a hint, never SDK tracebacks.
"""
from __future__ import annotations

import functools
import io
import tarfile
from pathlib import Path, PurePosixPath

import docker
import docker.errors

from .errors import Failure

START_HINT = "start one with `ci/engine.sh start` (installs and runs dockerd), then check with `build.py doctor`"
# Containers this toolkit creates carry this label, so a sweep can find exactly ours.
CREATED_BY_LABEL = "io.xla-images.created-by"


@functools.lru_cache(maxsize=1)
def client() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (default: the local unix socket).

    The API version is negotiated: the SDK may be newer than the engine (dockerd 20.10 speaks 1.41).
    """
    try:
        engine = docker.from_env(version="auto", timeout=600)
        engine.ping()
    except (docker.errors.DockerException, OSError) as error:
        raise Failure(f"no Docker engine answers: {_short(error)}", rule="engine-reachable",
                      hint=START_HINT) from None
    return engine


def api() -> docker.APIClient:
    """The low-level client of `client()` (streaming builds, archives)."""
    return client().api


def engine_version() -> str:
    """`20.10.24+dfsg1 (API 1.41)`."""
    info = client().version()
    return f"{info.get('Version', '?')} (API {info.get('ApiVersion', '?')})"


def extract_from_image(image: str, container_path: str, dest: Path) -> Path:
    """Copy `container_path` (a file or directory) out of `image` into the directory `dest`.

    Returns the path of the copy, `dest / basename(container_path)`; a symlink is followed (as `docker cp
    -L` does) and its target stored under the link's name. The container is created but never started, and
    is always removed, even when the copy fails. Members that would land outside `dest` (absolute paths,
    `..`) are refused; symlinks inside the copy that point outside it are skipped.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(container_path.rstrip("/") or "/").name
    container = _create_stopped(image)
    try:
        archive = _get_archive(container, image, container_path)
    finally:
        remove_container(container.id)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        try:
            tar.extractall(dest, filter=_renaming_filter(name))
        except tarfile.TarError as error:
            raise Failure(f"refusing to extract {container_path} from {image}: {error}",
                          rule="safe-extract") from None
    return dest / name


def _get_archive(container, image: str, container_path: str) -> io.BytesIO:
    try:
        stream, stat = container.get_archive(container_path)
        if stat.get("linkTarget"):
            # The engine reports the fully resolved target: fetch that instead of the link itself.
            stream, stat = container.get_archive(stat["linkTarget"])
        return io.BytesIO(b"".join(stream))
    except docker.errors.NotFound:
        raise Failure(f"{container_path} does not exist in image {image}", rule="image-path-exists") from None


def _renaming_filter(name: str):
    """tarfile filter: store the archive's top entry under `name`, safely (the `data` filter)."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        top, sep, rest = member.name.partition("/")
        member = member.replace(name=name + sep + rest, deep=False)
        try:
            return tarfile.data_filter(member, path)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
            return None

    return keep


def remove_container(container_id: str) -> None:
    """Force-remove a container (and its anonymous volumes); gone already is fine."""
    try:
        client().api.remove_container(container_id, v=True, force=True)
    except docker.errors.NotFound:
        pass


def _create_stopped(image: str):
    try:
        # The command is never run; it only satisfies images without CMD or ENTRYPOINT (imported bases).
        return client().containers.create(image, command=["true"], labels={CREATED_BY_LABEL: "extract"})
    except docker.errors.ImageNotFound:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it with `build.py build TAG` or pull it with `build.py pull TAG`") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot create a container from {image}: {_short(error)}", rule="engine-create") from None


def _short(error: Exception) -> str:
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


# --- registry and containers (publish) ---
