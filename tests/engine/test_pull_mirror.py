"""`pull --mirror` through a real pull-through cache in front of a real origin registry, on loopback.

The origin is a docker-registry with TLS (a CA of the test's own, trusted by the engine through certs.d and by
the toolkit the same way) and token auth, reached under an /etc/hosts name (registries_support). Token auth,
not htpasswd: distribution 2.8's proxy answers only a Bearer challenge of its origin (ci/registry.sh refuses a
Basic-auth origin for that reason). The mirror is started by `ci/registry.sh start-mirror` in a temporary
XLA_IMAGES_STATE with the origin's credentials and CA from the environment.

What it shows: the first cold pull fetches every blob from the origin (counted in the origin's access log);
after the image is removed, a second cold pull gets no blob from the origin at all; both give the image id that
was built; a mirror that does not answer is one clear error that tags nothing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

import registries_support as support
from registry_process import REGISTRY_SCRIPT, free_port
from publish_support import build_image, forget_image, make_project
from xla_images import names
from xla_images.run import engine

USER, PASSWORD = "zone-reader", "zone-" + os.urandom(12).hex()
REPOSITORY = "xla-images"
BLOB_GET = re.compile(r'"GET /v2/(?P<repository>[^ ]+)/blobs/(?P<digest>sha256:[0-9a-f]{64}) HTTP/[0-9.]+" 200 ')


pki = support.pki_fixture("the mirror test")


@pytest.fixture(scope="module")
def origin(pki: support.Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.TlsRegistry]:
    """TLS + token auth, with an access log to count what the mirror fetches; its CA in the engine's certs.d
    for the push (the pulls never reach the origin)."""
    tokens = support.TokenServer(pki, {USER: PASSWORD}, set()).start()
    try:
        with support.running_registry(pki, tmp_path_factory.mktemp("origin"), auth="token", token=tokens,
                                      access_log=True) as registry:
            yield registry
    finally:
        tokens.close()


class MirrorScript:
    """ci/registry.sh's mirror mode in a state directory of the test's own."""

    def __init__(self, state: Path, origin: support.TlsRegistry, pki: support.Pki) -> None:
        self.port = free_port()
        self.state = state
        self.env = {**os.environ, "PORT": str(self.port), "XLA_IMAGES_STATE": str(state),
                    "ORIGIN": f"https://{origin.host}", "ORIGIN_USER": USER, "ORIGIN_PASSWORD": PASSWORD,
                    "ORIGIN_CA": str(pki.ca)}
        self.outputs: list[str] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def directory(self) -> Path:
        return self.state / "registry" / str(self.port)

    def blob_gets(self) -> list[str]:
        """The digests of every blob the mirror served (GET, 200), in order, from its access log."""
        path = self.directory / "registry.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return [match["digest"] for match in BLOB_GET.finditer(text) if match["repository"] == REPOSITORY]

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["bash", str(REGISTRY_SCRIPT), command], env=self.env, capture_output=True,
                                text=True, timeout=120)
        self.outputs += [result.stdout, result.stderr]
        return result


@pytest.fixture(scope="module")
def mirror(origin: support.TlsRegistry, pki: support.Pki,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorScript]:
    script = MirrorScript(tmp_path_factory.mktemp("mirror-state"), origin, pki)
    try:
        started = script.run("start-mirror")
        assert started.returncode == 0, started.stderr + started.stdout
        again = script.run("start-mirror")  # idempotent: the running mirror of the same origin is kept
        assert again.returncode == 0 and "already running" in again.stdout, again.stderr + again.stdout
        yield script
    finally:
        stopped = script.run("stop")
        assert stopped.returncode == 0, stopped.stderr


def origin_blob_gets(origin: support.TlsRegistry) -> list[str]:
    """The digests of every blob the origin served (GET, 200), in order, from its access log."""
    return [match["digest"] for match in BLOB_GET.finditer(origin.log()) if match["repository"] == REPOSITORY]


def manifest_document(mirror: MirrorScript, digest: str) -> dict:
    """The manifest, read from the mirror with plain requests."""
    response = requests.get(f"http://{mirror.host}/v2/{REPOSITORY}/manifests/{digest}", timeout=10,
                            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                                               "application/vnd.oci.image.manifest.v1+json"})
    response.raise_for_status()
    return response.json()


def manifest_layers(mirror: MirrorScript, digest: str) -> set[str]:
    return {layer["digest"] for layer in manifest_document(mirror, digest)["layers"]}


def manifest_blobs(mirror: MirrorScript, digest: str) -> set[str]:
    """The config and layer digests of the manifest."""
    return {manifest_document(mirror, digest)["config"]["digest"], *manifest_layers(mirror, digest)}


def test_second_cold_pull_through_the_mirror_gets_no_blob_from_the_origin(
        pki: support.Pki, origin: support.TlsRegistry, mirror: MirrorScript, tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    flavour = project.flavour
    image_id = build_image(tmp_path / "ctx", flavour, (1,))
    client = support.Client(project, tmp_path, pki, "certs.d")
    client.login("auths", origin.host, USER, PASSWORD)
    target = f"{origin.host}/{REPOSITORY}"
    local_ref = f"{target}:{flavour.tag}"
    try:
        client("push", flavour.tag, "--registry", target)
        digest = json.loads(project.published.read_text())["flavours"][flavour.tag]["digest"]
        forget_image(flavour)
        assert engine.images.image_inspect(image_id) is None  # cold: the engine has nothing of it

        resolved = client("resolve", "--python", "3.11", "--mirror", mirror.host)
        assert resolved.stdout.strip() == f"{mirror.host}/{REPOSITORY}@{digest}"

        before, served = len(origin_blob_gets(origin)), len(mirror.blob_gets())
        started = time.monotonic()
        first = client("pull", "--python", "3.11", "--mirror", mirror.host)
        first_seconds = time.monotonic() - started
        first_gets = origin_blob_gets(origin)[before:]
        assert first.stdout.strip() == local_ref
        assert engine.images.image_inspect(local_ref)["Id"] == image_id  # type: ignore[index]
        # Every layer went origin -> cache -> engine. (The config blob, too, on the classic store. An engine on
        # the containerd store asked for no config over the wire here: not explained, so layers are what count.)
        layers = manifest_layers(mirror, digest)
        assert layers <= set(first_gets) <= manifest_blobs(mirror, digest)
        assert layers <= set(mirror.blob_gets()[served:])

        engine.images.remove_image(image_id, force=True)
        assert engine.images.image_inspect(image_id) is None  # cold again
        before, served = len(origin_blob_gets(origin)), len(mirror.blob_gets())
        started = time.monotonic()
        second = client("pull", "--python", "3.11", "--mirror", mirror.host)
        second_seconds = time.monotonic() - started
        second_gets = origin_blob_gets(origin)[before:]
        assert layers <= set(mirror.blob_gets()[served:])  # a cold pull: the engine fetched every layer again
        assert second.stdout.strip() == local_ref
        assert engine.images.image_inspect(local_ref)["Id"] == image_id  # type: ignore[index]
        assert second_gets == []  # every blob came from the mirror's disk
        print(f"origin blob GETs: first pull {len(first_gets)} of {len(set(first_gets))} blobs "
              f"({first_seconds:.1f} s), "
              f"second pull {len(second_gets)} ({second_seconds:.1f} s)", file=sys.stderr)

        engine.images.remove_image(image_id, force=True)
        away = f"127.0.0.1:{free_port()}"  # nothing listens there
        failed = client("pull", "--python", "3.11", "--mirror", away, expect=1)
        assert "[mirror-reachable]" in failed.stderr and f"pull mirror {away}" in failed.stderr
        assert "without --mirror" in failed.stderr
        assert failed.stderr.count("error") == 1 and failed.stdout == ""
        assert engine.images.image_inspect(local_ref) is None  # nothing tagged
        assert engine.images.image_inspect(image_id) is None
        wiped = mirror.run("wipe")  # the cache emptied, and the mirror restarted for the same origin
        assert wiped.returncode == 0, wiped.stderr
        status = mirror.run("status")
        assert status.returncode == 0 and f"mirror of https://{origin.host}" in status.stdout, status.stdout
        assert not list((mirror.directory / "data").rglob("data"))  # no blob left in the cache
        for text in [*client.outputs, *mirror.outputs, (mirror.directory / "config.yml").read_text(),
                     (mirror.directory / "registry.log").read_text(errors="replace")]:
            assert PASSWORD not in text
    finally:
        engine.images.remove_image(image_id, force=True)
        engine.images.remove_image(names.local_ref(flavour.tag), force=True)


def test_start_mirror_refuses_what_it_cannot_proxy_and_starts_nothing(
        pki: support.Pki, origin: support.TlsRegistry, tmp_path: Path) -> None:
    """Distribution 2.8's proxy never answers a Basic challenge of its origin: the script says so up front rather
    than start a mirror whose every fetch fails. Bad settings are refused before anything runs, never echoing a
    password."""
    basic = support.TlsRegistry(pki.name, free_port(), tmp_path / "basic")
    basic.start(pki, auth="htpasswd", htpasswd=support.write_htpasswd(tmp_path / "htpasswd", {USER: PASSWORD}))
    try:
        script = MirrorScript(tmp_path / "state", basic, pki)
        refused = script.run("start-mirror")
        assert refused.returncode == 1 and "Basic auth" in refused.stderr, refused.stderr
        assert not (script.directory / "registry.pid").exists() and not (script.directory / "config.yml").exists()
    finally:
        basic.stop()
    script = MirrorScript(tmp_path / "state", origin, pki)
    for changes, said in (({"ORIGIN": f"https://{origin.host}/v2"}, "no path"),
                          ({"ORIGIN": "http://registry.example.com"}, "https://"),
                          ({"ORIGIN": f"https://{USER}:{PASSWORD}@{origin.host}"}, "ORIGIN_USER and ORIGIN_PASSWORD"),
                          ({"ORIGIN_PASSWORD": ""}, "ORIGIN_PASSWORD is not"),
                          ({"ORIGIN_CA": str(tmp_path / "absent.pem")}, "not a readable file")):
        script.env.update(changes)
        result = script.run("start-mirror")
        assert result.returncode == 1 and said in result.stderr, (changes, result.stderr)
        script.env = MirrorScript(tmp_path / "state", origin, pki).env | {"PORT": str(script.port)}
    assert not (script.directory / "registry.pid").exists()
    assert all(PASSWORD not in text for text in script.outputs)
