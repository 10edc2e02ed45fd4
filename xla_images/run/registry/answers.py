"""What a registry answers, checked before it is used: bounded bodies read before an overall deadline (netread),
JSON of the shape the API defines, manifests of a known media type, digests of the one grammar and equal to the
one asked for. A registry that answers anything else gets a Failure under `registry-answer` (the wrong shape,
size or encoding) or `registry-digest` (bytes or a header of another digest than the one asked for), never a
traceback or a value passed on (a digest is printed by `resolve` as a reference, and promote tags it)."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import requests

from ...errors import Failure, shown_value
from ...model.published import is_digest  # the one digest grammar
from ...model.registry import INDEX_TYPES, MANIFEST_LIMIT, MANIFEST_TYPES
from .. import netread

__all__ = ["INDEX_TYPES", "MANIFEST_LIMIT", "MANIFEST_TYPES", "is_digest"]
# A token answer is small; an image config is a few KiB (MANIFEST_LIMIT: model.registry); any other answer that
# is not streamed (/v2/, an upload's, a DELETE's, an error's) holds at most a short JSON error document.
SMALL_ANSWER_LIMIT = 1 << 20
TOKEN_LIMIT = 1 << 20
CONFIG_LIMIT = 16 << 20
# Tag lists are read page by page, each page bounded, never accumulated as bytes: distribution's pages hold at
# most 1000 tags by default (~130 KiB at the 128 characters a tag may have); 4 MiB is room for any page size a
# registry chooses. At most MAX_TAGS tag names (each <= 128 characters: ~13 MB) are kept in all.
TAGS_LIMIT = 4 << 20
MAX_TAGS = 100_000
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # distribution's tag grammar

MANIFEST_MEDIA_TYPES = (MANIFEST_TYPES[0], INDEX_TYPES[0], MANIFEST_TYPES[1], INDEX_TYPES[1])


def refuse(host: str, what: str, problem: str) -> Failure:
    return Failure(f"registry {host} answered {what} with {problem}", rule="registry-answer",
                   hint="the registry (or a proxy before it) does not speak the distribution API as expected")


def checked_digest(value: object, host: str, what: str) -> str:
    if not is_digest(value):
        raise refuse(host, what, f"the digest {shown_value(value)}, not sha256:<64 hex>")
    return str(value)


def body(response: requests.Response, limit: int, host: str, what: str) -> bytes:
    """The streamed response body, read up to `limit` bytes (a larger one is refused before it is all in memory);
    a body cut short or in a broken encoding is a `registry-answer` Failure."""
    return netread.read_body(response, limit, host=f"registry {host}", what=what, rule="registry-answer")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def other_digest(host: str, what: str, got: str, asked: str) -> Failure:
    return Failure(f"registry {host} answered {what} with {got}, not the {asked} asked for", rule="registry-digest",
                   hint="content addressing is the registry's integrity guarantee: its storage, a cache or a proxy "
                        "before it serves other content; nothing was used")


def digest_equal(got: str, asked: str, host: str, what: str) -> str:
    """`got` when it is the digest asked for; a `registry-digest` Failure otherwise."""
    if got != asked:
        raise other_digest(host, what, got, asked)
    return got


def manifest_document(data: bytes, content_type: str, host: str, what: str) -> tuple[dict[str, Any], str]:
    """The manifest or index `data` holds and its media type, one of MANIFEST_MEDIA_TYPES: the document's own
    `mediaType` when it has one, else the Content-Type. Anything else (an HTML page, a JSON list, a schema 1
    manifest, a document of another shape) is refused before its digest is used."""
    document = json_object(data, host, what)
    declared = document.get("mediaType")
    if declared is not None and declared not in MANIFEST_MEDIA_TYPES:
        raise refuse(host, what, f"a document of media type {shown_value(declared)}, not a manifest or an index")
    media_type = declared or content_type.split(";")[0].strip()
    if media_type not in MANIFEST_MEDIA_TYPES:
        raise refuse(host, what, f"a document of Content-Type {shown_value(media_type)} and no known `mediaType`")
    if document.get("schemaVersion") != 2:
        raise refuse(host, what, f"schemaVersion {shown_value(document.get('schemaVersion'))}, not 2")
    if media_type in INDEX_TYPES:
        children = document.get("manifests")
        if not isinstance(children, list) or not all(isinstance(child, dict) for child in children):
            raise refuse(host, what, "an index whose `manifests` is not a list of objects")
    else:
        if not isinstance(document.get("config"), dict):
            raise refuse(host, what, "a manifest without a `config` object")
        blob_list(document, host)
    return document, media_type


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
    for tag in tags:
        if not TAG.fullmatch(tag):
            raise refuse(host, "the tag list", f"the tag {shown_value(tag)}, not a tag name")
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
