"""`build`'s skip of an up-to-date flavour looks at what the engine stores: on the containerd image store an image
with the flavour's id whose layers are in another compression than the site's (pulled from a gzip registry, say)
is built again, saying so (the push would send those blobs as they are and fail `push-compression`).

The engine's answers are stand-ins here (engine.stored is read for real in tests/unit/test_engine_stored.py and
against the engine in tests/engine/test_build.py)."""
from __future__ import annotations

import types

import pytest

from xla_images.model.compression import LAYER_MEDIA_TYPES, Compression
from xla_images.run.building import build
from xla_images.run import engine

ZSTD, GZIP = LAYER_MEDIA_TYPES["zstd"][0], LAYER_MEDIA_TYPES["gzip"][0]
IMAGE_ID = "sha256:" + "b" * 64
FLAVOUR = types.SimpleNamespace(tag="r9.9.9_3.11_cpu", id="sha256:" + "f" * 64, aliases=(), tags=("r9.9.9_3.11_cpu",))


class Notes:
    def __init__(self) -> None:
        self.notices: list[str] = []

    def state(self, flavour, text: str) -> None:
        pass

    def line(self, flavour, text: str) -> None:
        pass

    def finished(self, result: build.FlavourResult) -> None:
        pass

    def notice(self, text: str) -> None:
        self.notices.append(text)


def _run(monkeypatch: pytest.MonkeyPatch, export: Compression | None, stored: list[str] | None,
         force: bool = False) -> tuple[bool, Notes, list[str]]:
    asked: list[str] = []

    def layer_media_types(ref: str) -> list[str] | None:
        asked.append(ref)
        return stored

    monkeypatch.setattr(build, "built_image_id", lambda flavour: IMAGE_ID)
    monkeypatch.setattr(build, "_tag_aliases", lambda flavour, image_id: None)
    monkeypatch.setattr(build, "_image_size", lambda image_id: 1)
    monkeypatch.setattr(engine.stored, "layer_media_types", layer_media_types)
    reporter = Notes()
    run = build._Run(types.SimpleNamespace(), build.BuildOptions(force=force), reporter, export=export)
    run.results[FLAVOUR.tag] = build.FlavourResult(FLAVOUR)
    return run._up_to_date(FLAVOUR), reporter, asked


def test_an_image_stored_in_another_compression_is_built_again_saying_so(monkeypatch) -> None:
    up_to_date, reporter, asked = _run(monkeypatch, Compression("zstd", 3), [ZSTD, GZIP, GZIP])
    assert not up_to_date
    assert asked == [IMAGE_ID]
    [notice] = reporter.notices
    assert f"xla-images:{FLAVOUR.tag} has flavour id {FLAVOUR.id[7:19]}" in notice
    assert f"stored as {GZIP}, not the site's zstd level 3: building it again" in notice


def test_a_gzip_site_rebuilds_an_image_stored_as_zstd(monkeypatch) -> None:
    up_to_date, reporter, _ = _run(monkeypatch, Compression("gzip", None), [ZSTD])
    assert not up_to_date and "not the site's gzip" in reporter.notices[0]


@pytest.mark.parametrize("export, stored", [(Compression("zstd", 3), [ZSTD, ZSTD]),
                                            (Compression("gzip", None), [GZIP, LAYER_MEDIA_TYPES["gzip"][1]])],
                         ids=["zstd", "gzip-docker-and-oci"])
def test_an_image_stored_as_the_site_says_is_skipped(monkeypatch, export: Compression, stored: list[str]) -> None:
    up_to_date, reporter, _ = _run(monkeypatch, export, stored)
    assert up_to_date and reporter.notices == []


def test_the_classic_store_is_not_asked(monkeypatch) -> None:
    """It keeps layers uncompressed (export None): the push compresses them as the site says."""
    up_to_date, reporter, asked = _run(monkeypatch, None, [GZIP])
    assert up_to_date and asked == [] and reporter.notices == []


def test_force_asks_nothing(monkeypatch) -> None:
    up_to_date, _, asked = _run(monkeypatch, Compression("zstd", 3), [GZIP], force=True)
    assert not up_to_date and asked == []
