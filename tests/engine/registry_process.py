"""A docker-registry of our own for engine tests: ci/registry.sh (the real docker-registry, distribution 2.8) on a
127.0.0.1 port, with its state in a temp dir, and plain-`requests` reads of the HTTP API v2 (not the code under
test), so what a test asserts about the registry does not come from xla_images itself.

Each suite that needs fixed ports names a range of its own (5060-5089; 5000-5059 belong to the suite registry and
a CI run that may share the engine); a suite that passes no range gets any free port the kernel hands out.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import requests

REPO = Path(__file__).resolve().parents[2]
REGISTRY_SCRIPT = REPO / "ci" / "registry.sh"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((MANIFEST_V2, "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.oci.image.manifest.v1+json", OCI_INDEX))


def free_port(ports: range | None = None) -> int:
    """A port of `ports` nothing listens on, else (none given, or all taken) any free port.

    A bound port fails the probe, so a registry or proxy already running is never handed out twice; the
    fallback is an ephemeral port, which cannot collide with another suite's fixed range.
    """
    for port in ports or ():
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RegistryProcess:
    """A docker-registry of our own, through ci/registry.sh, with its state in a temp dir."""

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
    def data(self) -> Path:
        return self.state / "registry" / str(self.port) / "data"

    @property
    def blob_dir(self) -> Path:
        return self.data / "docker" / "registry" / "v2" / "blobs"

    # the process

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REGISTRY_SCRIPT), command], env=self.env, capture_output=True,
                              text=True, timeout=120)

    def script(self, command: str) -> None:
        result = self.run(command)
        assert result.returncode == 0, result.stderr

    def start(self) -> None:
        self.script("start")

    def stop(self) -> None:
        self.script("stop")

    def crash(self) -> None:
        """SIGKILL, as a power cut or OOM kill would: no graceful shutdown."""
        pid_file = self.state / "registry" / str(self.port) / "registry.pid"
        os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.answers() and time.monotonic() < deadline:
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    # what it stores, read independently of xla_images

    def blobs(self) -> tuple[int, int]:
        """(count, bytes) of blob data files on disk, counted independently of xla_images.run.shipping.prune."""
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


@contextmanager
def running(state: Path, ports: range | None = None) -> Iterator[RegistryProcess]:
    """A registry on a free port of `ports` (see free_port), started for the block and stopped after it."""
    process = RegistryProcess(state, free_port(ports))
    process.start()
    try:
        yield process
    finally:
        process.stop()
