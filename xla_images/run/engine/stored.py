"""What the containerd image store holds of an image: its layers' media types, so their compression.

Docker 26's API says it nowhere but in `docker save`: on the containerd store an image's id is the digest of its
manifest (or index), and the save stream is the store's blobs, in digest order. Reading up to the manifest can
mean gigabytes (a minute for a real flavour), so each answer is kept in the cache under that digest, which makes it
never stale; a build that has just exported an image's layers notes them there at once (`remember`).
"""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from ... import diskio, userfiles
from ...cache import cache_dir
from ...errors import Failure, XlaImagesError
from ...model.registry import INDEX_TYPES, MANIFEST_LIMIT
from . import connection, images


def layer_media_types(ref: str) -> list[str] | None:
    """The media types of the image's layers as the containerd image store holds them (so: their compression),
    bottom first; None on the classic store (it keeps layers uncompressed) or when the save names no manifest."""
    if connection.image_store() != "containerd":
        return None
    attrs = images.image_inspect(ref)
    if attrs is None:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists")
    image_id = str(attrs["Id"])
    remembered = _remembered(image_id)
    if remembered is not None:
        return remembered
    found = _read_from_save(ref, image_id)
    if found is not None:
        remember(image_id, found)
    return found


def remember(image_id: str, media_types: list[str]) -> None:
    """Note the layer media types of the containerd-store image `image_id` (the digest of its manifest, so the
    note is never stale): a build that has just exported its layers knows them; a pull's are read once."""
    try:
        diskio.write_text_atomic(_note_path(image_id), json.dumps({"layers": media_types}),
                                 "a stored-layers cache entry", root=cache_dir())
    except XlaImagesError:
        pass  # a cache that cannot be written costs the next skip check one read of the export


def _note_path(image_id: str) -> Path:
    return cache_dir() / "stored-layers" / f"{image_id.removeprefix('sha256:')}.json"


def _remembered(image_id: str) -> list[str] | None:
    try:
        # Read bounded (a note is a few KiB): cutting a whole read at 1 MiB still read a huge file whole.
        layers = json.loads(userfiles.read_text(_note_path(image_id), limit=1 << 20))["layers"]
    except (XlaImagesError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return [str(item) for item in layers] if isinstance(layers, list) and layers else None


def _read_from_save(ref: str, image_id: str) -> list[str] | None:
    wanted = {image_id.removeprefix("sha256:")}
    seen: dict[str, dict[str, Any]] = {}
    chunks = images.save_image_stream(ref)
    try:
        with tarfile.open(fileobj=io.BufferedReader(images.ChunkReader(chunks), 1 << 20), mode="r|") as saved:
            for member in saved:
                digest = member.name.removeprefix("blobs/sha256/")
                # A manifest or index is small: a blob past the limit is a layer or config, passed over unread.
                if digest == member.name or not member.isfile() or member.size > MANIFEST_LIMIT:
                    continue
                handle = saved.extractfile(member)
                document = _json_object(handle.read() if handle else b"")
                if document is None:
                    continue
                seen[digest] = document
                found = _layer_types(wanted, seen)
                if found is not None:
                    return found
    except tarfile.TarError as error:
        raise Failure(f"cannot read the export of {ref}: {error}", rule="engine-save") from None
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # the engine stops exporting the rest
    return None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):  # a small layer or some other blob; JSON nested past the parser's depth
        return None
    return document if isinstance(document, dict) else None


def _layer_types(wanted: set[str], seen: dict[str, dict[str, Any]]) -> list[str] | None:
    """The layer media types of the first wanted manifest seen; an index seen adds its manifests to `wanted`."""
    for digest in sorted(wanted & set(seen)):
        document = seen[digest]
        if document.get("mediaType") in INDEX_TYPES or "manifests" in document:
            wanted.discard(digest)
            wanted.update(str(item.get("digest", "")).removeprefix("sha256:")
                          for item in document.get("manifests") or [] if isinstance(item, dict)
                          and (item.get("platform") or {}).get("os") != "unknown")  # not an attestation
            return _layer_types(wanted, seen)
        if isinstance(document.get("layers"), list):
            return [str(layer.get("mediaType")) for layer in document["layers"] if isinstance(layer, dict)]
    return None
