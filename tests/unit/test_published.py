"""model.published: published.json read and validated whole; what it writes, it reads back."""
from __future__ import annotations

import json

import pytest

from xla_images.errors import ConfigError
from xla_images.model import published

DIGEST = "sha256:" + "b" * 64


def entry(tag: str, promotions: tuple = ()) -> published.Published:
    return published.Published(tag, (tag, f"{tag}-latest"), "127.0.0.1:5000/x", DIGEST, {"a": "b"},
                               {"python": "3.11"}, "2026-12-04T00:00:00+00:00", promotions)


def test_what_is_written_reads_back_equal() -> None:
    copy = {"registry": "registry.example.com/prod", "digest": DIGEST, "ref": "r", "from": "f", "promoted_at": "t"}
    entries = {"b": entry("b"), "a": entry("a", (copy,))}
    text = published.document(entries)
    assert list(json.loads(text)["flavours"]) == ["a", "b"]  # sorted by tag
    assert published.parse_published(text, "p.json") == entries


@pytest.mark.parametrize("digest, good", [(DIGEST, True), (DIGEST + "\n", False), (DIGEST.upper(), False),
                                          ("sha256:" + "b" * 63, False), (None, False), (7, False)])
def test_digest_grammar(digest: object, good: bool) -> None:
    assert published.is_digest(digest) is good


def test_every_problem_names_its_line() -> None:
    document = json.loads(published.document({"a": entry("a")}))
    document["flavours"]["a"]["promotions"] = [{"registry": "127.0.0.1:5000/y"}]
    text = json.dumps(document, indent=2)
    with pytest.raises(ConfigError) as caught:
        published.parse_published(text, "p.json")
    assert caught.value.rule == "published-format"
    assert caught.value.location.line == text.splitlines().index('    "a": {') + 1
