"""What a registry answers, checked before it is used: bounded bodies, JSON of the shape the API defines,
digests of the one grammar. A registry that answers anything else gets a Failure under `registry-answer`,
never a traceback or a value passed on (a digest header is printed by `resolve` as a reference)."""
from __future__ import annotations

import json
from typing import Any

import requests

from ...errors import Failure, shown_value
from ...model.published import is_digest  # the one digest grammar

__all__ = ["is_digest"]
# distribution refuses manifests over 4 MiB; a tag list of 100000 tags is ~3 MiB; a token answer is small.
MANIFEST_LIMIT = 4 << 20
TAGS_LIMIT = 16 << 20
TOKEN_LIMIT = 1 << 20
CONFIG_LIMIT = 16 << 20


def refuse(host: str, what: str, problem: str) -> Failure:
    return Failure(f"registry {host} answered {what} with {problem}", rule="registry-answer",
                   hint="the registry (or a proxy before it) does not speak the distribution API as expected")


def checked_digest(value: object, host: str, what: str) -> str:
    if not is_digest(value):
        raise refuse(host, what, f"the digest {shown_value(value)}, not sha256:<64 hex>")
    return str(value)


def body(response: requests.Response, limit: int, host: str, what: str) -> bytes:
    """The response body, read up to `limit` bytes: a larger one is refused before it is all in memory."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise refuse(host, what, f"{declared} bytes (at most {limit} expected)")
    chunks, size = [], 0
    for chunk in response.iter_content(chunk_size=1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            response.close()
            raise refuse(host, what, f"more than {limit} bytes")
    return b"".join(chunks)


def json_object(data: bytes, host: str, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise refuse(host, what, "a body that is not JSON") from None
    if not isinstance(document, dict):
        raise refuse(host, what, f"a JSON {type(document).__name__}, not an object")
    return document


def tag_list(document: dict[str, Any], host: str) -> list[str]:
    tags = document.get("tags")
    if tags is None:
        return []  # distribution answers `"tags": null` for a repository whose tags were all deleted
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise refuse(host, "the tag list", "`tags` that is not a list of strings")
    return tags


def blob_list(manifest: dict[str, Any], host: str) -> list[dict[str, Any]]:
    """The manifest's `layers` (and nothing else), each with a checked digest and an integer size."""
    layers = manifest.get("layers") or []
    if not isinstance(layers, list):
        raise refuse(host, "a manifest", "`layers` that is not a list")
    for layer in layers:
        if not isinstance(layer, dict):
            raise refuse(host, "a manifest", "a layer that is not an object")
        checked_digest(layer.get("digest"), host, "a manifest layer")
        if not isinstance(layer.get("size", 0), int) or isinstance(layer.get("size"), bool) or layer.get("size", 0) < 0:
            raise refuse(host, "a manifest", "a layer size that is not a whole number")
    return layers
