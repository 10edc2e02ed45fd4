"""published.json, the record of verified pushes and promotions: its model, read and validated whole.

Pure except for the one bounded read (`read_published`): run.shipping.publish pushes and records, run.shipping.promote adds
promotions, resolve/prune/sign/merge read. Every field any of them uses is checked here, before anything uses
it, so a hand-edited or foreign file is one `published-format` error at its line, never a traceback later:

    {"schema": 1, "flavours": {TAG: {"tag": TAG, "tags": [TAG, ...], "registry": "HOST[:PORT]/REPO",
     "digest": "sha256:<64 hex>", "ref": ..., "labels": {str: str}, "flavour": {...}, "pushed_at": str,
     "promotions": [{"registry": "HOST[:PORT]/REPO", "digest": "sha256:<64 hex>", "ref": str, "from": str,
                     "promoted_at": str}, ...]}}}

A key written twice in one object (a tag, a field) is refused like matrix.yaml's duplicate keys, instead of
silently keeping the last; NaN, Infinity and nesting deeper than JSON needs are refused too.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import userfiles
from ..errors import ConfigError, Failure, Location, shorten, shown_value
from ..names import PUBLISHED_SCHEMA
from .registry import registry_problem

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The size of published.json its readers accept (read_published), and so the size it is ever written at
# (`document`): one constant for both, so a promotion of an image with megabytes of labels is refused before it
# writes a record that push, resolve, prune and sign would then all refuse to read (issue 41).
PUBLISHED_LIMIT = userfiles.JSON_LIMIT
PROMOTION_FIELDS = ("registry", "digest", "ref", "from", "promoted_at")


def is_digest(text: object) -> bool:
    """`sha256:<64 lowercase hex>` exactly (fullmatch: "sha256:...\\n" is not a digest)."""
    return isinstance(text, str) and DIGEST.fullmatch(text) is not None


@dataclass(frozen=True)
class Published:
    """One fully verified flavour, as published.json records it."""

    tag: str
    tags: tuple[str, ...]
    registry: str
    digest: str
    labels: dict[str, str]
    flavour: dict[str, Any]
    pushed_at: str
    # Copies `promote` made by digest to other registries: {registry, digest, ref, from, promoted_at}.
    promotions: tuple[dict[str, str], ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.registry}@{self.digest}"

    @property
    def digests(self) -> set[str]:
        """Every digest this entry vouches for: the push and its promoted copies (prune never deletes them)."""
        return {self.digest, *(str(copy["digest"]) for copy in self.promotions)}

    def to_json(self) -> dict[str, Any]:
        document = {"tag": self.tag, "tags": list(self.tags), "registry": self.registry, "digest": self.digest,
                    "ref": self.ref, "labels": self.labels, "flavour": self.flavour, "pushed_at": self.pushed_at}
        if self.promotions:
            document["promotions"] = [dict(copy) for copy in self.promotions]
        return document

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Published:
        """An entry `entry_problem` found nothing wrong with."""
        return cls(str(data["tag"]), tuple(data["tags"]), str(data["registry"]), str(data["digest"]),
                   dict(data.get("labels") or {}), dict(data["flavour"]), str(data.get("pushed_at", "")),
                   tuple(dict(copy) for copy in data.get("promotions") or ()))


def document(entries: dict[str, Published]) -> str:
    """The text of published.json for `entries`, flavours sorted by tag: the one format push and merge write.
    A text larger than PUBLISHED_LIMIT (what read_published accepts) is refused, naming the largest label."""
    flavours = {tag: entries[tag].to_json() for tag in sorted(entries)}
    text = json.dumps({"schema": PUBLISHED_SCHEMA, "flavours": flavours}, indent=2, sort_keys=False) + "\n"
    size = len(text.encode("utf-8"))
    if size > PUBLISHED_LIMIT:
        raise _too_large(entries, size)
    return text


def _too_large(entries: dict[str, Published], size: int) -> Failure:
    labels = [(len(json.dumps(name)) + len(json.dumps(value)), tag, name) for tag, entry in entries.items()
              for name, value in entry.labels.items()]
    if labels:
        length, tag, name = max(labels)
        culprit = f"; the largest label is {shown_value(name)} of {tag} ({length} bytes)"
    else:
        culprit = ""
    return Failure(f"published.json would be {size} bytes, more than the {PUBLISHED_LIMIT} its readers accept"
                   f"{culprit}", rule="published-size",
                   hint="nothing was written; shrink that label in the image (or its Dockerfile), rebuild, push again")


def read_published(path: Path) -> dict[str, Published]:
    """The verified pushes recorded in `path` ({} when there is none); read bounded, every field checked."""
    if not os.path.lexists(path):  # a directory, fifo, device, dangling link or symlink loop is not "none yet":
        return {}                  # read_text refuses it (callers must not skip it with is_file() either)
    return parse_published(userfiles.read_text(path, limit=PUBLISHED_LIMIT), str(path))


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a value published.json holds")


def parse_published(text: str, where: str) -> dict[str, Published]:
    """Every entry of a published.json text, validated whole; a ConfigError at the line of the first problem."""
    def refuse(message: str, line: int = 1) -> ConfigError:
        return ConfigError(f"not a published.json written by `build.py push`: {message}",
                           location=Location(where, line), rule="published-format", hint="delete it and push again")

    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_refuse_duplicates,
                          parse_int=userfiles.bounded_int)
    except json.JSONDecodeError as error:
        raise refuse(error.msg, error.lineno) from None
    except _Duplicate as duplicate:
        raise refuse(f"key {shown_value(duplicate.key)} is written twice in one object",
                     _line_of_second(text, json.dumps(duplicate.key))) from None
    except (ValueError, RecursionError) as error:  # NaN/Infinity, a 5000-digit number, 100000 nested arrays
        raise refuse(shorten(str(error) or type(error).__name__, 80)) from None
    if not isinstance(data, dict):
        raise refuse(f"the top level is a {type(data).__name__}, not an object")
    if type(data.get("schema")) is not int or data["schema"] != PUBLISHED_SCHEMA:  # noqa: E721 -- not true/1.0
        raise refuse(f"schema is {shown_value(data.get('schema'))}, this xla-images reads {PUBLISHED_SCHEMA}")
    flavours = data.get("flavours")
    if not isinstance(flavours, dict):
        raise refuse("`flavours` is not an object")
    entries = {}
    for tag, entry in flavours.items():
        problem = entry_problem(tag, entry)
        if problem:
            raise refuse(f"flavour {shown_value(tag)}: {problem}", _line_of(text, json.dumps(tag)))
        entries[tag] = Published.from_json(entry)
    return entries


def entry_problem(tag: str, entry: Any) -> str | None:
    """What is wrong with one entry, or None. Every field a command reads is checked, promotions included."""
    if not isinstance(entry, dict):
        return "the entry is not an object"
    if entry.get("tag") != tag:
        return f"its `tag` is {shown_value(entry.get('tag'))}"
    tags = entry.get("tags")
    if not isinstance(tags, list) or not tags or not all(isinstance(item, str) and item for item in tags):
        return "`tags` is not a list of tag names"
    if len(set(tags)) != len(tags):
        return "`tags` names a tag twice"
    problem = _registry_problem(entry.get("registry"))
    if problem:
        return f"`registry` {problem}"
    if not is_digest(entry.get("digest")):
        return f"`digest` {shown_value(entry.get('digest'))} is not a sha256:<64 hex> digest"
    if not isinstance(entry.get("flavour"), dict):
        return "`flavour` is not an object"
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return "`labels` is not an object of strings"
    if not isinstance(entry.get("pushed_at", ""), str):
        return "`pushed_at` is not a string"
    return _promotions_problem(entry.get("promotions", []))


def _promotions_problem(promotions: Any) -> str | None:
    if promotions is None:
        return None
    if not isinstance(promotions, list):
        return f"`promotions` is a {type(promotions).__name__}, not a list of copies"
    registries = set()
    for number, copy in enumerate(promotions, start=1):
        where = f"promotion {number}"
        if not isinstance(copy, dict):
            return f"{where} is not an object"
        problem = _registry_problem(copy.get("registry"))
        if problem:
            return f"{where}: `registry` {problem}"
        if not is_digest(copy.get("digest")):
            return f"{where}: `digest` {shown_value(copy.get('digest'))} is not a sha256:<64 hex> digest"
        strange = [name for name, value in copy.items() if name in PROMOTION_FIELDS and not isinstance(value, str)]
        if strange:
            return f"{where}: `{strange[0]}` is not a string"
        if copy["registry"] in registries:
            return f"{where}: {copy['registry']} is promoted to twice"
        registries.add(copy["registry"])
    return None


def _registry_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{shown_value(value)} is not a string"
    problem = registry_problem(value)
    return f"{shown_value(value)}: {problem}" if problem else None


def _line_of(text: str, needle: str) -> int:
    return text.count("\n", 0, max(text.find(needle), 0)) + 1


def _line_of_second(text: str, key: str) -> int:
    """The line of the second place `key` (JSON-quoted) is written as a key (followed by a colon)."""
    places = [match.start() for match in re.finditer(re.escape(key) + r"\s*:", text)]
    return text.count("\n", 0, places[1] if len(places) > 1 else 0) + 1
