"""run.shipping.zstd_push against an in-memory registry that keeps upload sessions the way distribution does (POST opens,
PATCH appends at the Content-Range offset, PUT ?digest= checks the sha256) and a fake engine export in docker
save's OCI layout. The real `zstd` compresses; what is uploaded is decompressed again and compared."""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from support.registry import tar_of
from xla_images.errors import Failure
from xla_images.model.compression import OCI_MANIFEST, Compression
from xla_images.model.registry import Registry
from xla_images.run.shipping import zstd_push
from xla_images.run.registry import RegistryClient, RetryPolicy

NO_WAIT = RetryPolicy(attempts=1, first_wait=0, max_wait=0)
ZSTD = Compression("zstd", 3)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Answer(requests.Response):
    """A real requests.Response over bytes in memory: the client streams and bounds every body it reads."""

    def __init__(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        super().__init__()
        self.status_code, self.raw = status, io.BytesIO(body)
        self.headers.update({"Content-Length": str(len(body)), **(headers or {})})


class MemoryRegistry:
    """A requests-session stand-in holding blobs, manifests and open uploads of one repository."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        self.uploads: dict[str, bytearray] = {}
        self.calls: list[tuple[str, str]] = []
        self.cancelled: list[str] = []

    def mount(self, prefix: str, adapter: Any) -> None:
        pass

    def request(self, method: str, url: str, headers: dict[str, str], auth: Any, timeout: float,
                allow_redirects: bool, data: bytes | None = None, params: dict[str, str] | None = None,
                stream: bool = False) -> Answer:
        path = urlsplit(url).path
        self.calls.append((method, path))
        if "/blobs/uploads/" in path:
            return self._upload(method, path, headers, data or b"", params or {})
        kind, reference = path.rsplit("/", 2)[-2:]
        if kind == "blobs" and method == "HEAD":
            blob = self.blobs.get(reference)
            return Answer(404) if blob is None else Answer(200, {"Content-Length": str(len(blob))})
        if kind == "manifests" and method == "PUT":
            self.manifests[reference] = data or b""
            self.manifests[sha(data or b"")] = data or b""
            return Answer(201, {"Docker-Content-Digest": sha(data or b"")})
        if kind == "manifests" and method == "HEAD":
            manifest = self.manifests.get(reference)
            return Answer(404) if manifest is None else Answer(200, {"Docker-Content-Digest": sha(manifest)})
        raise AssertionError(f"unexpected {method} {path}")

    def _upload(self, method: str, path: str, headers: dict[str, str], data: bytes,
                params: dict[str, str]) -> Answer:
        if method == "POST":
            session = f"/v2/xla-images/blobs/uploads/{len(self.uploads)}"
            self.uploads[session] = bytearray()
            return Answer(202, {"Location": session})
        if method == "DELETE":
            self.cancelled.append(path)
            return Answer(204)
        received = self.uploads[path]
        if method == "PATCH":
            start = int(headers["Content-Range"].split("-")[0])
            assert start == len(received), "a chunk at the wrong offset"
            received += data
            return Answer(202, {"Location": path})
        assert method == "PUT"
        received += data
        if sha(bytes(received)) != params["digest"]:
            return Answer(400)
        self.blobs[params["digest"]] = bytes(received)
        return Answer(201)


def client_for(memory: MemoryRegistry) -> RegistryClient:
    return RegistryClient(Registry.parse("127.0.0.1:5999/xla-images"), None, retry=NO_WAIT,
                          session=memory)  # type: ignore[arg-type]


def layer_tar(seed: int, size: int = 300_000) -> bytes:
    """A layer's tar with content zstd can compress (repeated text) and some that it cannot (varying bytes)."""
    noise = b"".join(hashlib.sha256(f"{seed}-{index}".encode()).digest() for index in range(2000))  # 64 KB
    payload = (f"layer {seed} ".encode() * (size // 16)) + noise
    return tar_of({f"file-{seed}": payload})


class FakeImage:
    """An image as the engine shows it (inspect) and exports it (`docker save`, blobs/sha256/<digest> first)."""

    def __init__(self, layers: list[bytes], legacy: bool = False) -> None:
        self.layers = layers
        self.config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [sha(layer) for layer in layers]},
                                  "config": {"Labels": {"a": "b"}}}).encode()
        self.legacy = legacy
        self.exports = 0
        self.members: dict[str, bytes] | None = None

    def inspect(self, ref: str) -> dict[str, Any]:
        return {"Id": sha(self.config), "RootFS": {"Layers": [sha(layer) for layer in self.layers]}}

    def export(self, ref: str) -> Iterator[bytes]:
        self.exports += 1
        members = self.members
        if members is None:
            if self.legacy:  # engines before 25: <id>/layer.tar and <config hex>.json
                members = {f"{index}/layer.tar": layer for index, layer in enumerate(self.layers)}
                members[f"{sha(self.config)[7:]}.json"] = self.config
            else:
                members = {f"blobs/sha256/{sha(layer)[7:]}": layer for layer in self.layers}
                members[f"blobs/sha256/{sha(self.config)[7:]}"] = self.config
            members["manifest.json"] = b"[]"
        data = tar_of(members)
        for start in range(0, len(data), 70_000):  # chunk edges that fall inside tar headers and members
            yield data[start:start + 70_000]


@pytest.fixture
def image(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> FakeImage:
    made = FakeImage([layer_tar(1), layer_tar(2), layer_tar(1)])  # a repeated layer is stored and sent once
    monkeypatch.setattr(zstd_push.engine.images, "image_inspect", made.inspect)
    monkeypatch.setattr(zstd_push.engine.images, "save_image_stream", made.export)
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "cache"))
    return made


def unzstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-d", "-c"], input=data, capture_output=True, check=True).stdout


def test_every_uploaded_layer_decompresses_to_the_layer_the_engine_named(image: FakeImage) -> None:
    memory = MemoryRegistry()
    pushed = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1", "alias"])
    manifest = json.loads(pushed.manifest)
    assert manifest["mediaType"] == OCI_MANIFEST
    assert manifest["config"] == {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": sha(image.config), "size": len(image.config)}
    assert memory.blobs[sha(image.config)] == image.config  # the image id survives the push
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+zstd"] * 3
    for descriptor, original in zip(manifest["layers"], image.layers):
        blob = memory.blobs[descriptor["digest"]]
        assert len(blob) == descriptor["size"] < len(original)
        assert unzstd(blob) == original
    assert manifest["layers"][0] == manifest["layers"][2]
    assert memory.manifests["r1"] == memory.manifests["alias"] == pushed.manifest
    assert pushed.digest == sha(pushed.manifest)
    assert [layer.uploaded for layer in pushed.layers] == [True, True, True]


def test_layers_larger_than_a_chunk_go_in_patches_at_their_offsets(image: FakeImage,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("xla_images.run.registry.upload.DEFAULT_CHUNK", 4096)
    memory = MemoryRegistry()
    pushed = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert sum(1 for method, _ in memory.calls if method == "PATCH") >= 2  # the registry checked each offset
    assert unzstd(memory.blobs[pushed.layers[1].digest]) == image.layers[1]


def test_a_second_push_neither_exports_nor_uploads_and_gives_the_same_digest(image: FakeImage) -> None:
    memory = MemoryRegistry()
    first = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    uploads = len(memory.uploads)
    again = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert (again.digest, image.exports, len(memory.uploads)) == (first.digest, 1, uploads)
    assert not any(layer.uploaded for layer in again.layers)


def test_another_registry_gets_every_layer_even_with_the_digests_remembered(image: FakeImage) -> None:
    first = zstd_push.push_zstd("img", client_for(MemoryRegistry()), ZSTD, ["r1"])
    other = MemoryRegistry()
    again = zstd_push.push_zstd("img", client_for(other), ZSTD, ["r1"])
    assert again.digest == first.digest
    assert set(other.blobs) == {layer.digest for layer in first.layers} | {sha(image.config)}


def test_the_level_is_part_of_the_digest(image: FakeImage) -> None:
    fast = zstd_push.push_zstd("img", client_for(MemoryRegistry()), Compression("zstd", 1), ["r1"])
    small = zstd_push.push_zstd("img", client_for(MemoryRegistry()), Compression("zstd", 19), ["r1"])
    assert fast.digest != small.digest
    assert sum(layer.size for layer in small.layers) <= sum(layer.size for layer in fast.layers)


def test_the_legacy_save_layout_pushes_the_same_manifest(image: FakeImage, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Any) -> None:
    oci = zstd_push.push_zstd("img", client_for(MemoryRegistry()), ZSTD, ["r1"])
    image.legacy = True
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "another-cache"))
    legacy = zstd_push.push_zstd("img", client_for(MemoryRegistry()), ZSTD, ["r1"])
    assert legacy.digest == oci.digest and image.exports == 2


def test_a_layer_missing_from_the_export_tags_nothing(image: FakeImage) -> None:
    image.members = {f"blobs/sha256/{sha(image.layers[0])[7:]}": image.layers[0],
                     f"blobs/sha256/{sha(image.config)[7:]}": image.config}
    memory = MemoryRegistry()
    with pytest.raises(Failure) as caught:
        zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert caught.value.rule == "push-zstd" and sha(image.layers[1])[7:19] in caught.value.message
    assert memory.manifests == {}


def test_a_layer_whose_content_is_not_its_name_is_refused(image: FakeImage) -> None:
    image.members = {f"blobs/sha256/{sha(image.layers[0])[7:]}": image.layers[1],
                     f"blobs/sha256/{sha(image.layers[1])[7:]}": image.layers[1],
                     f"blobs/sha256/{sha(image.config)[7:]}": image.config}
    memory = MemoryRegistry()
    with pytest.raises(Failure, match="other content") as caught:
        zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert caught.value.rule == "push-zstd" and memory.manifests == {}


def test_an_export_that_is_not_a_tar_is_one_error(image: FakeImage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zstd_push.engine.images, "save_image_stream", lambda ref: iter([b"\x00garbage" * 100]))
    with pytest.raises(Failure) as caught:
        zstd_push.push_zstd("img", client_for(MemoryRegistry()), ZSTD, ["r1"])
    assert caught.value.rule == "push-zstd"


def test_an_interrupt_mid_upload_cancels_the_session_and_puts_no_manifest(image: FakeImage,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    memory = MemoryRegistry()
    real_write = zstd_push.BlobUpload.write

    def interrupted(self: Any, data: bytes) -> None:
        real_write(self, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(zstd_push.BlobUpload, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert memory.cancelled and memory.manifests == {}


def test_no_zstd_on_path_is_one_error_with_the_fix(image: FakeImage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(Failure) as caught:
        zstd_push.push_zstd("img", client_for(MemoryRegistry()), ZSTD, ["r1"])
    assert caught.value.rule == "push-zstd" and "compression.format=gzip" in (caught.value.hint or "")


def test_a_damaged_cache_entry_is_ignored(image: FakeImage) -> None:
    memory = MemoryRegistry()
    first = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    cache = zstd_push.DigestCache(ZSTD, zstd_push.zstd_version())
    for entry in cache.folder.iterdir():
        entry.write_text('{"digest": "sha256:nothex", "size": "12"}')
    again = zstd_push.push_zstd("img", client_for(memory), ZSTD, ["r1"])
    assert again.digest == first.digest and image.exports == 2
