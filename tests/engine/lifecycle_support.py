"""Helpers shared by the lifecycle tests: tiny images pushed over the registry API.

The registries are registry_process's (ci/registry.sh on 127.0.0.1, this family's ports: PORTS). Images are
written straight over the HTTP API v2 with plain `requests` (not the code under test): a gzip layer shared by
all, one of their own, and an image config whose diff_ids are right, so the engine can pull them.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass

import requests

from registry_process import MANIFEST_V2, OCI_INDEX, RegistryProcess

PORTS = range(5070, 5080)  # the lifecycle suites' share of loopback ports (they run one after another)


def put_blob(registry: RegistryProcess, repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = requests.post(f"{registry.url}/v2/{repository}/blobs/uploads/", timeout=30)
    assert started.status_code == 202, started.text
    location = started.headers["Location"]
    if location.startswith("/"):
        location = registry.url + location
    done = requests.put(location, params={"digest": digest}, data=data,
                        headers={"Content-Type": "application/octet-stream"}, timeout=60)
    assert done.status_code == 201, done.text
    return digest


def put_manifest(registry: RegistryProcess, repository: str, reference: str, body: bytes,
                 media_type: str = MANIFEST_V2) -> str:
    response = requests.put(f"{registry.url}/v2/{repository}/manifests/{reference}", data=body,
                            headers={"Content-Type": media_type}, timeout=30)
    assert response.status_code == 201, response.text
    return str(response.headers["Docker-Content-Digest"])


@dataclass(frozen=True)
class Image:
    digest: str
    manifest: bytes
    blobs: dict[str, int]  # digest -> size: config and layers

    @property
    def total(self) -> int:
        return sum(self.blobs.values())


def layer(name: str, payload: bytes) -> tuple[bytes, bytes]:
    """(uncompressed tar, gzip) of one file; gzip without a timestamp so equal payloads give equal blobs."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    tar = raw.getvalue()
    return tar, gzip.compress(tar, mtime=0)


SHARED = layer("shared.bin", b"xla-images shared base layer\n" * 2048)
SHARED_DIGEST = "sha256:" + hashlib.sha256(SHARED[1]).hexdigest()


def push_image(registry: RegistryProcess, repository: str, tags: list[str], payload: bytes,
               labels: dict[str, str] | None = None) -> Image:
    """A pullable image (shared layer + one of its own) under every tag in `tags`."""
    own = layer("own.bin", payload)
    layers = [SHARED, own]
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": labels or {}, "Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest() for tar, _ in layers]},
    }, sort_keys=True).encode()
    blobs = {put_blob(registry, repository, config): len(config)}
    for _, compressed in layers:
        blobs[put_blob(registry, repository, compressed)] = len(compressed)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_V2,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(compressed),
                    "digest": "sha256:" + hashlib.sha256(compressed).hexdigest()} for _, compressed in layers],
    }, indent=3).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    for reference in tags or [digest]:  # no tag: stored by digest only (an index's child)
        assert put_manifest(registry, repository, reference, manifest) == digest
    return Image(digest, manifest, blobs)


def push_index(registry: RegistryProcess, repository: str, tags: list[str], child: Image) -> str:
    """An OCI index naming `child` (already in `repository`)."""
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": MANIFEST_V2, "size": len(child.manifest), "digest": child.digest,
         "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    for tag in tags:
        assert put_manifest(registry, repository, tag, index, OCI_INDEX) == digest
    return digest
