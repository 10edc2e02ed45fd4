"""Images on the engine: inspect, labels, layers and history, tag and untag, import a root filesystem, save,
remove. A missing image is None or a Failure naming it, never an SDK exception."""
from __future__ import annotations

import io
from typing import Any, Iterable, Iterator

import docker
import docker.errors
import requests

from ...errors import Failure
from . import connection


def image_labels(ref: str) -> dict[str, str] | None:
    """The image's labels ({} when it has none), or None when no such image is on the engine."""
    attrs = image_inspect(ref)
    if attrs is None:
        return None
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def image_layers(ref: str) -> list[str]:
    """Diff ids of the image's layers, bottom first (equal ids = the same bytes, stored once)."""
    attrs = image_inspect(ref)
    if attrs is None:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists")
    return list((attrs.get("RootFS") or {}).get("Layers") or [])


def distribution_error(ref: str) -> str | None:
    """None when the registry of `ref` serves it (asked without pulling), else why not."""
    try:
        connection.api().inspect_distribution(ref)
        return None
    except (docker.errors.APIError, requests.exceptions.RequestException) as error:
        return connection.error_text(error).splitlines()[0][:200]


def images_labelled(labels: dict[str, str]) -> list[dict]:
    """Images carrying all these labels (engine list entries: Id, RepoTags, Labels, Created, Size)."""
    return connection.api().images(filters={"label": [f"{key}={value}" for key, value in labels.items()]})


def import_rootfs(chunks: Iterable[bytes], repository: str, tag: str, changes: list[str]) -> str:
    """`docker import` a root filesystem tar stream as `repository:tag`; Dockerfile `changes` add config.

    Returns the new image id. The engine tags only a complete import, so a broken stream tags nothing.
    """
    try:
        output = connection.api().import_image(src=iter(chunks), repository=repository, tag=tag, changes=changes,
                                    stream_src=True)
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"importing {repository}:{tag} failed: {connection.error_text(error)}",
                      rule="engine-import") from None
    for line in reversed(str(output).splitlines()):
        if '"error"' in line:
            raise Failure(f"importing {repository}:{tag} failed: {line}", rule="engine-import")
    attrs = image_inspect(f"{repository}:{tag}")
    if attrs is None:
        raise Failure(f"the engine did not keep the imported {repository}:{tag}", rule="engine-import")
    return str(attrs["Id"])


def remove_if_unnamed(image_id: str) -> bool:
    """Remove an image that has no tag and no container; True if it was removed."""
    attrs = image_inspect(image_id)
    if attrs is None or attrs.get("RepoTags"):
        return False
    try:
        connection.api().remove_image(image_id)
        return True
    except docker.errors.APIError:
        return False  # a container uses it, or it has children: keep it


def image_inspect(ref: str) -> dict | None:
    """The engine's inspect document of an image (Id, Config.Labels, Config.Env, RepoDigests), or None."""
    try:
        return connection.api().inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as error:
        if getattr(error, "status_code", None) == 404:
            return None
        raise Failure(f"cannot inspect {ref}: {connection.error_text(error)}", rule="engine-inspect") from None


def image_history(ref: str) -> list[dict]:
    """One entry per layer-producing step, newest first (CreatedBy, Comment, Size)."""
    try:
        return list(connection.api().history(ref))
    except docker.errors.ImageNotFound:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists") from None


def save_image_stream(ref: str) -> Iterator[bytes]:
    """`docker save` as a stream of chunks: read it once, never held whole (images reach 8 GB)."""
    try:
        yield from connection.api().get_image(ref, chunk_size=4 << 20)
    except docker.errors.ImageNotFound:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot export {ref}: {connection.error_text(error)}", rule="engine-save") from None


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (an export from `save_image_stream`), for tarfile's
    stream mode: one pass, never held whole."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while self._offset >= len(self._buffer):
            try:
                self._buffer, self._offset = memoryview(next(self._chunks)), 0
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer) - self._offset)
        target[:size] = self._buffer[self._offset:self._offset + size]
        self._offset += size
        return size

    def close(self) -> None:
        # Closing the generator ends the engine's export (its HTTP response) instead of leaving it half read.
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        super().close()


def tag_image(image: str, repository: str, tag: str) -> None:
    try:
        connection.api().tag(image, repository, tag, force=True)
    except docker.errors.APIError as error:
        raise Failure(f"cannot tag {image} as {repository}:{tag}: {connection.error_text(error)}",
                      rule="engine-tag") from None


def remove_tag(ref: str) -> None:
    """Drop one name of an image; the image stays while other names or containers use it. Absent is fine."""
    try:
        connection.api().remove_image(ref, noprune=True)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as error:
        if getattr(error, "status_code", None) != 404:
            raise Failure(f"cannot untag {ref}: {connection.error_text(error)}", rule="engine-untag") from None


def remove_image(ref: str, *, force: bool = False) -> bool:
    """Remove an image by name or id (with its now-unused layers). False when it was not there."""
    try:
        connection.api().remove_image(ref, force=force)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as error:
        raise Failure(f"cannot remove {ref}: {connection.error_text(error)}", rule="engine-remove") from None
