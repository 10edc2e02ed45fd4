"""Helpers shared by the lifecycle tests: registries of our own and tiny images pushed over the registry API.

Registries run through ci/registry.sh (the real docker-registry, distribution 2.8) on 127.0.0.1:5030-5039 with
their state in a temp dir. Images are written straight over the HTTP API v2 with plain `requests` (not the code
under test): a gzip layer shared by all, one of their own, and an image config whose diff_ids are right, so the
engine can pull them.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
REGISTRY_SCRIPT = REPO / "ci" / "registry.sh"
PORTS = range(5030, 5040)
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((MANIFEST_V2, "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.oci.image.manifest.v1+json", OCI_INDEX))


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 5030-5039")


@dataclass
class LocalRegistry:
    state: Path
    port: int

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PORT": str(self.port), "XLA_IMAGES_STATE": str(self.state)}

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def blob_dir(self) -> Path:
        return self.state / "registry" / str(self.port) / "data" / "docker" / "registry" / "v2" / "blobs"

    def script(self, command: str) -> None:
        result = subprocess.run(["bash", str(REGISTRY_SCRIPT), command], env=self.env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr

    def blobs(self) -> tuple[int, int]:
        """(count, bytes) of blob data files on disk, counted independently of xla_images.prune."""
        files = list(self.blob_dir.glob("sha256/*/*/data")) if self.blob_dir.is_dir() else []
        return len(files), sum(path.stat().st_size for path in files)

    def digest(self, repository: str, reference: str) -> str | None:
        response = requests.head(f"{self.url}/v2/{repository}/manifests/{reference}", headers={"Accept": ACCEPT},
                                 timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return str(response.headers["Docker-Content-Digest"])

    def tags(self, repository: str) -> list[str]:
        response = requests.get(f"{self.url}/v2/{repository}/tags/list", timeout=10)
        return [] if response.status_code == 404 else sorted(response.json().get("tags") or [])

    def answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    # writing images

    def put_blob(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        started = requests.post(f"{self.url}/v2/{repository}/blobs/uploads/", timeout=30)
        assert started.status_code == 202, started.text
        location = started.headers["Location"]
        if location.startswith("/"):
            location = self.url + location
        done = requests.put(location, params={"digest": digest}, data=data,
                            headers={"Content-Type": "application/octet-stream"}, timeout=60)
        assert done.status_code == 201, done.text
        return digest

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str = MANIFEST_V2) -> str:
        response = requests.put(f"{self.url}/v2/{repository}/manifests/{reference}", data=body,
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


def push_image(registry: LocalRegistry, repository: str, tags: list[str], payload: bytes,
               labels: dict[str, str] | None = None) -> Image:
    """A pullable image (shared layer + one of its own) under every tag in `tags`."""
    own = layer("own.bin", payload)
    layers = [SHARED, own]
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": labels or {}, "Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest() for tar, _ in layers]},
    }, sort_keys=True).encode()
    blobs = {registry.put_blob(repository, config): len(config)}
    for _, compressed in layers:
        blobs[registry.put_blob(repository, compressed)] = len(compressed)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_V2,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(compressed),
                    "digest": "sha256:" + hashlib.sha256(compressed).hexdigest()} for _, compressed in layers],
    }, indent=3).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    for reference in tags or [digest]:  # no tag: stored by digest only (an index's child)
        assert registry.put_manifest(repository, reference, manifest) == digest
    return Image(digest, manifest, blobs)


def push_index(registry: LocalRegistry, repository: str, tags: list[str], child: Image) -> str:
    """An OCI index naming `child` (already in `repository`)."""
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": MANIFEST_V2, "size": len(child.manifest), "digest": child.digest,
         "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    for tag in tags:
        assert registry.put_manifest(repository, tag, index, OCI_INDEX) == digest
    return digest
