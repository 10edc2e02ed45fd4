"""Push, resolve and pull through a fault-injecting proxy (faultproxy.py) in front of a real docker-registry.

dockerd (gzip) or the toolkit (zstd, the default) uploads the blobs, dockerd downloads them; dockerd treats any
127.0.0.0/8 registry as plain http, so pointing `--registry` at the proxy puts every byte of the push through
the faults. After each fault the registry is
asked directly (not through the proxy) whether every tag names a manifest whose blobs it holds, and
published.json must parse whole and list only flavours whose every tag serves the recorded digest.
The images are FROM scratch with a few MB of random bytes (fresh blobs every time, so nothing is skipped).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from faultproxy import Fault, FaultProxy
from publish_support import PASSWORD, Project, build_image, forget_image, make_project, registry_named_images
from registry_process import ACCEPT, REPO, RegistryProcess, free_port, running
from xla_images import names
from xla_images.run import engine

REPOSITORY = "xla-images"
PORTS = range(5060, 5070)  # this suite's share of loopback ports; anything free if they are taken


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    with running(tmp_path / "state", PORTS) as process:
        yield process


@pytest.fixture
def proxy(registry: RegistryProcess) -> Iterator[FaultProxy]:
    # The registry listens on its port, so the probe passes over it.
    with FaultProxy(("127.0.0.1", registry.port), free_port(PORTS), lifetime=240) as running_proxy:
        yield running_proxy


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    created = make_project(tmp_path / "project")
    build_image(tmp_path / "ctx", created.flavour, (6, 6))
    yield created
    engine.images.remove_image(names.local_ref(created.flavour.tag), force=True)


def use_compression(project: Project, compression: str) -> None:
    """zstd: the toolkit uploads the layers (the default); gzip: the engine pushes (site setting). On the containerd
    store the engine pushes both, as stored: the image is built again with its layers compressed so."""
    with (project.root / "site.yaml").open("a", encoding="utf-8") as site:
        site.write(f"compression: {{format: {compression}}}\n")
    if compression != "zstd" and engine.connection.image_store() == "containerd":
        engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)  # not left dangling
        build_image(project.root.parent / "ctx", project.flavour, (6, 6), compression)


def push(project: Project, proxy: FaultProxy, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return project.cli("push", project.flavour.tag, "--registry", f"{proxy.address}/{REPOSITORY}", timeout=timeout)


def consistent_tags(registry: RegistryProcess) -> dict[str, str]:
    """Every tag the registry lists serves a manifest whose config and layers it holds; tag -> digest."""
    digests = {}
    base = f"http://{registry.host}/v2/{REPOSITORY}"
    for tag in registry.tags(REPOSITORY):
        response = requests.get(f"{base}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10)
        assert response.status_code == 200, f"tag {tag} names a missing manifest (HTTP {response.status_code})"
        manifest = response.json()
        for blob in [manifest["config"], *manifest["layers"]]:
            assert requests.head(f"{base}/blobs/{blob['digest']}", timeout=10).status_code == 200, \
                f"tag {tag}: blob {blob['digest']} is missing"
        digests[tag] = response.headers["Docker-Content-Digest"]
    return digests


def first_layer_path(registry: RegistryProcess, tag: str) -> str:
    """The blob path of the manifest's first layer: a fault aimed there cannot be taken by the small config."""
    response = requests.get(f"http://{registry.host}/v2/{REPOSITORY}/manifests/{tag}", headers={"Accept": ACCEPT},
                            timeout=10)
    response.raise_for_status()
    return f"/blobs/{response.json()['layers'][0]['digest']}$"


def published_flavours(project: Project, registry: RegistryProcess) -> dict[str, dict]:
    """published.json parses whole, and each flavour in it has every tag serving its digest."""
    if not project.published.exists():
        return {}
    flavours = json.loads(project.published.read_text(encoding="utf-8"))["flavours"]
    served = consistent_tags(registry)
    for tag, entry in flavours.items():
        for name in entry["tags"]:
            assert served.get(name) == entry["digest"], f"published {tag}: {name} does not serve {entry['digest']}"
    assert not list(project.published.parent.glob(".published.json-*")), "a temp file of published.json is left"
    return flavours


def assert_clean(result: subprocess.CompletedProcess[str], proxy: FaultProxy) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert registry_named_images(proxy.address) == []  # the push's temporary local names are gone


# --- push ------------------------------------------------------------------------------------------------

# Layer bytes go up in PATCH requests (the classic store's push, the zstd push) or in the closing PUT of an upload
# (the containerd store's push): both are aimed at.
UPLOAD = "PATCH|PUT"
TRANSIENT = {
    # dockerd retries a layer upload cut half-way (it waits 5 s first); the zstd push asks again from the offset
    # the registry answers, or pushes again (layers the registry holds are skipped).
    "reset-mid-blob": [Fault("reset", method=UPLOAD, path="/blobs/uploads/", after_bytes=1 << 20, times=2)],
    # A 500/503 burst on the manifest PUT (push pushes again), /v2/ and the verifying HEAD (tenacity).
    "5xx-burst": [Fault("status", method="GET", path="^/v2/$", status=503, times=2),
                  Fault("status", method="PUT", path="/manifests/", status=503, times=2),
                  Fault("status", method="HEAD", path="/manifests/", status=500, times=2)],
    # An upload that stops for 4 s half-way, on a 4 MB/s link; the verifying HEAD stalls 2 s.
    "stall-slow-link": [Fault("stall", method=UPLOAD, path="/blobs/uploads/", after_bytes=2 << 20, seconds=4),
                        Fault("slow", method=UPLOAD, path="/blobs/uploads/", rate=4 << 20, times=-1),
                        Fault("stall", method="HEAD", path="/manifests/", direction="response", seconds=2)],
}


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_push_rides_out_transient_faults(name: str, compression: str, project: Project, registry: RegistryProcess,
                                         proxy: FaultProxy) -> None:
    use_compression(project, compression)
    proxy.add(*TRANSIENT[name])

    result = push(project, proxy)

    assert result.returncode == 0, result.stderr
    assert sorted(set(proxy.fired_kinds())) == sorted({fault.kind for fault in TRANSIENT[name]}), proxy.fired
    published = published_flavours(project, registry)
    assert set(published) == {project.flavour.tag}
    assert set(consistent_tags(registry)) == set(project.flavour.tags)
    assert_clean(result, proxy)


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_push_failing_for_good_is_a_clear_error_and_a_rerun_completes(compression: str, project: Project,
                                                                      registry: RegistryProcess,
                                                                      proxy: FaultProxy) -> None:
    use_compression(project, compression)
    other = {"schema": 1, "flavours": {}}
    project.published.write_text(json.dumps(other) + "\n", encoding="utf-8")
    before = project.published.read_bytes()
    alias = project.flavour.aliases[0]
    # The canonical tag goes through; its first alias is refused with 503 however often it is pushed.
    proxy.add(Fault("status", method="PUT", path=f"/manifests/{alias}$", status=503, times=-1))

    failed = push(project, proxy)

    assert failed.returncode == 1, failed.stderr
    if compression == "gzip" or engine.connection.image_store() == "containerd":  # the engine's push, pushed again
        assert "503 Service Unavailable" in failed.stderr and "(5 attempts)" in failed.stderr, failed.stderr
        assert f"pushing {alias} again" in failed.stderr
    else:  # the toolkit's manifest PUT, asked again by the registry client
        assert f"push of {proxy.address}/{REPOSITORY}:{alias} failed" in failed.stderr, failed.stderr
        assert "HTTP 503" in failed.stderr and "after 5 attempt(s)" in failed.stderr, failed.stderr
    assert_clean(failed, proxy)
    assert project.published.read_bytes() == before  # the flavour is not recorded: not all its tags verified
    assert alias not in consistent_tags(registry)  # the tag that did go up names a whole manifest

    proxy.clear()
    rerun = push(project, proxy)

    assert rerun.returncode == 0, rerun.stderr
    assert set(published_flavours(project, registry)) == {project.flavour.tag}
    assert set(consistent_tags(registry)) == set(project.flavour.tags)
    assert_clean(rerun, proxy)


@pytest.mark.usefixtures("ctrl_c_raises")  # the child starts with SIGINT at its default
@pytest.mark.parametrize(("signum", "compression"), [(signal.SIGINT, "zstd"), (signal.SIGTERM, "gzip")],
                         ids=["SIGINT-group-zstd", "SIGTERM-gzip"])
def test_interrupted_push_stops_cleanly_and_a_rerun_completes(signum: int, compression: str, project: Project,
                                                              registry: RegistryProcess, proxy: FaultProxy) -> None:
    use_compression(project, compression)
    project.published.write_text('{"schema": 1, "flavours": {}}\n', encoding="utf-8")
    before = project.published.read_bytes()
    # 12 MB at 0.5 MB/s: ~20 s
    proxy.add(Fault("slow", method=UPLOAD, path="/blobs/uploads/", rate=512 << 10, times=-1))
    command = [sys.executable, str(REPO / "build.py"), "push", project.flavour.tag, "--registry",
               f"{proxy.address}/{REPOSITORY}", "--matrix", str(project.root / "matrix.yaml"),
               "--site", str(project.root / "site.yaml")]
    # A session of its own: SIGINT goes to the whole process group, as a terminal's Ctrl-C does.
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "CI": "true"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "slow" not in proxy.fired_kinds():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.05)
        time.sleep(1)  # mid-blob
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # a terminal's Ctrl-C reaches the whole group
        else:
            process.send_signal(signum)  # CI cancelling the job, `kill`
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()

    assert process.returncode == 130, err
    assert err.rstrip().splitlines()[-1] in ("aborted", "interrupted"), err  # click says "aborted"
    assert "Traceback" not in err
    assert project.published.read_bytes() == before
    assert registry_named_images(proxy.address) == []
    consistent_tags(registry)

    proxy.clear()
    rerun = push(project, proxy)
    assert rerun.returncode == 0, rerun.stderr
    assert set(published_flavours(project, registry)) == {project.flavour.tag}
    assert_clean(rerun, proxy)


# --- resolve and pull ------------------------------------------------------------------------------------

def test_resolve_and_pull_through_faults(project: Project, registry: RegistryProcess, proxy: FaultProxy,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # dockerd 26 sometimes never retries a download reset half-way (no log line for minutes): the pull's stall
    # watchdog restarts it, so this case is bounded either way.
    monkeypatch.setenv(engine.transfer.PULL_STALL_ENV, "20")
    assert push(project, proxy).returncode == 0
    digest = published_flavours(project, registry)[project.flavour.tag]["digest"]
    ref = f"{proxy.address}/{REPOSITORY}@{digest}"
    image_id = engine.images.image_inspect(names.local_ref(project.flavour.tag))["Id"]

    # Re-verifying the published digest meets a 503 and a 500: retried, then answered.
    proxy.add(Fault("status", method="HEAD", path="/manifests/", status=503),
              Fault("status", method="HEAD", path="/manifests/", status=500))
    resolved = project.cli("resolve", "--python", "3.11")
    assert resolved.returncode == 0 and resolved.stdout.strip() == ref, resolved.stderr
    assert proxy.fired_kinds() == ["status", "status"]

    # A layer download cut half-way: dockerd fetches it again (or the watchdog pulls again); the very image
    # that was built arrives.
    forget_image(project.flavour)
    layer = first_layer_path(registry, project.flavour.tag)
    proxy.add(Fault("reset", method="GET", path=layer, direction="response", after_bytes=1 << 20))
    try:
        pulled = project.cli("pull", "--python", "3.11", timeout=300)
        assert pulled.returncode == 0, pulled.stderr
        assert pulled.stdout.strip() == ref
        assert "reset" in proxy.fired_kinds()
        assert engine.images.image_inspect(ref)["Id"] == image_id
    finally:
        engine.images.remove_image(ref, force=True)

    # A registry that answers nothing but 503: resolve warns and still gives the recorded (immutable)
    # digest; pull fails clearly. (resolve --registry then fails naming the attempts: a unit test.)
    proxy.add(Fault("status", status=503, times=-1))
    down = project.cli("resolve", "--python", "3.11")
    assert down.returncode == 0 and down.stdout.strip() == ref, down.stderr
    assert f"warning: could not re-verify {ref}: registry {proxy.address} does not answer (HTTP 503)" in down.stderr
    pull_down = project.cli("pull", "--python", "3.11", timeout=300)
    assert pull_down.returncode == 1 and "pull of" in pull_down.stderr, pull_down.stderr
    for result in (down, pull_down):
        assert "Traceback" not in result.stderr
    assert engine.images.image_inspect(ref) is None


def test_pull_through_a_stalled_download_is_restarted_by_the_watchdog(
        project: Project, registry: RegistryProcess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer download that stops dead (no reset, no bytes) for longer than the stall limit: the pull is
    cancelled and started again, and the second attempt brings the very image that was pushed."""
    monkeypatch.setenv(engine.transfer.PULL_STALL_ENV, "5")
    assert push(project, proxy).returncode == 0
    digest = published_flavours(project, registry)[project.flavour.tag]["digest"]
    ref = f"{proxy.address}/{REPOSITORY}@{digest}"
    image_id = engine.images.image_inspect(names.local_ref(project.flavour.tag))["Id"]
    forget_image(project.flavour)
    proxy.add(Fault("stall", method="GET", path=first_layer_path(registry, project.flavour.tag),
                    direction="response", after_bytes=1 << 20, seconds=200))
    try:
        pulled = project.cli("pull", "--python", "3.11", timeout=120)
        assert pulled.returncode == 0, pulled.stderr
        assert "no progress for 5 s: pulling" in pulled.stderr and "attempt 2 of 3" in pulled.stderr, pulled.stderr
        assert proxy.fired_kinds() == ["stall"]
        assert engine.images.image_inspect(ref)["Id"] == image_id
    finally:
        engine.images.remove_image(ref, force=True)


def test_pull_that_keeps_stalling_fails_clearly_and_leaves_no_image(
        project: Project, registry: RegistryProcess, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine.transfer.PULL_STALL_ENV, "3")
    assert push(project, proxy).returncode == 0
    digest = published_flavours(project, registry)[project.flavour.tag]["digest"]
    ref = f"{proxy.address}/{REPOSITORY}@{digest}"
    forget_image(project.flavour)
    proxy.add(Fault("stall", method="GET", path=first_layer_path(registry, project.flavour.tag),
                    direction="response", after_bytes=1 << 20, seconds=200, times=-1))
    pulled = project.cli("pull", "--python", "3.11", timeout=120)
    assert pulled.returncode == 1, pulled.stderr
    assert f"pull of {ref} stalled: the engine reported no progress for 3 s, 3 times" in pulled.stderr
    assert "[pull-stall]" in pulled.stderr and "Traceback" not in pulled.stderr
    assert proxy.fired_kinds().count("stall") >= 3
    assert engine.images.image_inspect(ref) is None
    proxy.clear()
    again = project.cli("pull", "--python", "3.11", timeout=120)  # the registry is whole: a re-run completes
    try:
        assert again.returncode == 0, again.stderr
    finally:
        engine.images.remove_image(ref, force=True)
