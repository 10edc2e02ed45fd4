"""model.published: published.json read and validated whole; what it writes, it reads back."""
from __future__ import annotations

import dataclasses
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


def test_a_publication_is_never_written_larger_than_its_readers_accept(tmp_path) -> None:
    """Issue 41: promote of an image whose config holds 15 MiB of labels wrote a published.json every reader
    refuses. The writer refuses instead (exit 1, rule published-size), naming the label, and writes nothing."""
    from xla_images.errors import Failure
    from xla_images.run.shipping import publish

    labels = {"org.example.small": "x", "org.example.huge": "y" * (15 << 20)}
    big = published.Published("t", ("t",), "127.0.0.1:5000/x", DIGEST, labels, {}, "now")
    path = tmp_path / "published.json"
    with pytest.raises(Failure) as caught:
        publish.write_published(path, {"t": big})
    assert caught.value.rule == "published-size" and caught.value.exit_code == 1
    assert "'org.example.huge' of t" in caught.value.message and str(published.PUBLISHED_LIMIT) in caught.value.message
    assert not path.exists()


def test_the_writer_reaches_the_readers_limit_and_no_further(tmp_path) -> None:
    """Writer and reader share PUBLISHED_LIMIT: a document just under it is written and read back."""
    small = published.document({"t": entry("t")})
    filler = published.PUBLISHED_LIMIT - len(small.encode()) - 64
    fits = published.Published("t", ("t",), "127.0.0.1:5000/x", DIGEST, {"a": "b" * filler}, {"python": "3.11"},
                               "2026-12-04T00:00:00+00:00")
    path = tmp_path / "published.json"
    path.write_text(published.document({"t": fits}), encoding="utf-8")
    assert published.read_published(path) == {"t": fits}
    with pytest.raises(Exception, match="published-size|more than"):
        published.document({"t": dataclasses.replace(fits, labels={"a": "b" * (filler + 128)})})
