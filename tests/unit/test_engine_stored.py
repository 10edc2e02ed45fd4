"""engine.stored: the layer media types of a containerd-store image, read from a `docker save` stream (a stand-in
here: an OCI layout tar built in memory, blobs in digest order as the engine writes them) up to the image's
manifest, and remembered under the image id."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from xla_images.run.engine import connection, images, stored

ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def _blob(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


def _manifest(*media_types: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": "sha256:" + "c" * 64},
                       "layers": [{"mediaType": kind, "digest": "sha256:" + "d" * 64} for kind in media_types]}
                      ).encode()


def _save(blobs: list[tuple[str, bytes]]) -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for digest, data in sorted(blobs):
            member = tarfile.TarInfo(f"blobs/sha256/{digest}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    raw = out.getvalue()
    return [raw[i:i + 1000] for i in range(0, len(raw), 1000)]


@pytest.fixture
def engine_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "cache"))
    saves: list[str] = []

    def stand_in(image_id: str, blobs: list[tuple[str, bytes]], store: str = "containerd") -> list[str]:
        monkeypatch.setattr(connection, "image_store", lambda: store)
        monkeypatch.setattr(images, "image_inspect", lambda ref: {"Id": image_id})

        def save(ref: str):
            saves.append(ref)
            yield from _save(blobs)

        monkeypatch.setattr(images, "save_image_stream", save)
        return saves

    return stand_in


def test_the_manifest_the_id_names_gives_the_layer_types_and_other_json_is_not_taken(engine_of) -> None:
    other = _blob(_manifest(ZSTD))  # another image's manifest in the same save: not the one the id names
    layer = _blob(b"\x1f\x8b" + b"x" * 5000)
    manifest = _blob(_manifest(GZIP, GZIP))
    saves = engine_of(f"sha256:{manifest[0]}", [other, layer, manifest, _blob(b'{"architecture": "amd64"}')])
    assert stored.layer_media_types("img") == [GZIP, GZIP]
    assert stored.layer_media_types("img") == [GZIP, GZIP]
    assert saves == ["img"]  # the second answer was remembered under the id: no second export


def test_an_index_is_followed_to_its_platform_manifest_not_its_attestation(engine_of) -> None:
    manifest = _blob(_manifest(GZIP))
    attestation = _blob(_manifest("application/vnd.in-toto+json"))
    index = _blob(json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"digest": f"sha256:{attestation[0]}", "platform": {"os": "unknown", "architecture": "unknown"}},
        {"digest": f"sha256:{manifest[0]}", "platform": {"os": "linux", "architecture": "amd64"}}]}).encode())
    engine_of(f"sha256:{index[0]}", [manifest, attestation, index])
    assert stored.layer_media_types("pulled") == [GZIP]


def test_what_a_build_remembers_is_the_answer_without_an_export(engine_of) -> None:
    saves = engine_of("sha256:" + "a" * 64, [])
    stored.remember("sha256:" + "a" * 64, [ZSTD, ZSTD])
    assert stored.layer_media_types("built") == [ZSTD, ZSTD] and saves == []


def test_no_manifest_in_the_save_is_none_and_nothing_is_remembered(engine_of) -> None:
    saves = engine_of("sha256:" + "e" * 64, [_blob(b"[1, 2]"), _blob(b"not json")])
    assert stored.layer_media_types("odd") is None
    assert stored.layer_media_types("odd") is None and len(saves) == 2


def test_the_classic_store_is_none_without_an_export(engine_of) -> None:
    saves = engine_of("sha256:" + "e" * 64, [], store="classic")
    assert stored.layer_media_types("classic") is None and saves == []


def test_json_nested_past_the_parsers_depth_is_passed_over_not_a_traceback(engine_of) -> None:
    deep = _blob(b"[" * 100_000 + b"]" * 100_000)  # a blob of a pulled image: RecursionError in json.loads
    manifest = _blob(_manifest(GZIP))
    engine_of(f"sha256:{manifest[0]}", [deep, manifest])
    assert stored.layer_media_types("img") == [GZIP]
