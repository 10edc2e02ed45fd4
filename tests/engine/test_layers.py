"""Layered, reproducible images through BuildKit, on the real engine, with tiny local wheels.

* the cpu and tpu flavours of one release share every layer but libtpu's (and libtpu's is the only extra);
* a rebuild that runs every step again (`--no-cache`: nothing from the build cache) gives the same layer digests;
* the classic builder (engines without buildx) still builds a flavour, the CA still in no layer.
The real torch_xla flavours are measured by benchmarks/bench_layers.py and the e2e test.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from xla_images import names
from xla_images.model.registry import Registry
from xla_images.run import build, engine, publish
from xla_images.run.build import BuildOptions, Outcome

RELEASE = "8.91.0"


class _Quiet:
    def state(self, flavour, text: str) -> None:
        pass

    def line(self, flavour, text: str) -> None:
        pass

    def finished(self, result) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


@pytest.fixture(scope="module")
def pair(make_project):
    """The tpu and cpu flavours of one release, built together (two at a time) through BuildKit."""
    if not engine.buildkit.use_buildkit():
        pytest.skip(f"BuildKit is not usable here: {engine.buildkit.buildx_info().problem}")
    project = make_project(RELEASE, accelerators=("tpu", "cpu"), payload=b"x" * (1 << 20))
    plan = project.plan()
    results = build.build_flavours(plan, list(plan.flavours), BuildOptions(jobs=2), _Quiet())
    assert [result.outcome for result in results] == [Outcome.BUILT] * 2, [result.message for result in results]
    return project


def _layers(project, accelerator: str) -> list[str]:
    return engine.images.image_layers(names.local_ref(project.flavour(RELEASE, accelerator).tag))


def test_cpu_and_tpu_share_every_layer_but_libtpus(pair, test_base: str) -> None:
    cpu, tpu = _layers(pair, "cpu"), _layers(pair, "tpu")
    base = engine.images.image_layers(test_base)
    assert cpu[:len(base)] == tpu[:len(base)] == base
    only_tpu = [layer for layer in tpu if layer not in cpu]
    assert len(only_tpu) == 1, f"tpu has {len(only_tpu)} layers cpu lacks: {only_tpu}"
    assert [layer for layer in tpu if layer != only_tpu[0]] == cpu, "the shared layers are not in the same order"
    # libtpu's layer is the last wheel layer: only the smoke suite's layer comes after it.
    assert tpu.index(only_tpu[0]) == len(tpu) - 2
    assert len(cpu) >= len(base) + 4, "expected the venv, torch-any, torch_xla and smoke layers at least"
    log = (pair.root / "reports" / pair.flavour(RELEASE, "tpu").tag / "build.log").read_text()
    assert "layer libtpu: " in log and "wheel(s): libtpu" in log, "the split did not report libtpu's group"
    assert "layer torch-any: " in log and "wheel(s): torch\n" in log.replace("\r", "")
    # torch (python-independent here) lives under /opt/xla-images/any; site-packages links to it, and the
    # top-level modules of both groups import, their .pyc files in the one site-packages/__pycache__.
    run = engine.containers.run_container(names.local_ref(pair.flavour(RELEASE, "tpu").tag), ["python", "-c", (
        "import torch, torch_top, torch_xla_top, libtpu, os, importlib.metadata as m;"
        "print(os.path.realpath(torch.__file__), m.version('torch'), torch_top.NAME, torch_xla_top.NAME)")],
        role="test")
    assert run.exit_code == 0, run.output
    assert run.output.split() == ["/opt/xla-images/any/torch/__init__.py", RELEASE, "torch", "torch_xla"]


def test_rebuild_from_no_cache_gives_the_same_layer_digests(pair) -> None:
    flavour = pair.flavour(RELEASE, "tpu")
    before = _layers(pair, "tpu")
    results = build.build_flavours(pair.plan(), [flavour], BuildOptions(force=True, no_cache=True), _Quiet())
    assert results[0].outcome is Outcome.BUILT, results[0].message
    log = results[0].log.read_text()
    assert not _cached_steps(log), f"--no-cache still took steps from the build cache: {_cached_steps(log)}"
    after = _layers(pair, "tpu")
    assert len(after) == len(before)
    differing = [index for index, (old, new) in enumerate(zip(before, after)) if old != new]
    assert not differing, f"layers {differing} of {len(before)} changed in a rebuild of the same inputs"


def test_no_layer_holds_the_ca_or_the_pip_settings(pair) -> None:
    flavour = pair.flavour(RELEASE, "tpu")
    found = _scan(engine.images.save_image_stream(names.local_ref(flavour.tag)),
                  [pair.ca_marker.encode(), b"no-index = true", pair.wheel_marker.encode()])
    assert found[pair.wheel_marker.encode()], "control: the scan must see the wheels' bytes"
    assert not found[pair.ca_marker.encode()], "the CA bundle (a BuildKit secret) reached a layer"
    assert not found[b"no-index = true"], "pip.conf (a BuildKit secret) reached a layer"
    history = json.dumps(engine.images.image_history(names.local_ref(flavour.tag)))
    assert pair.ca_marker not in history and "pip.conf" not in history.replace("id=pip.conf", "")


def test_classic_builder_still_builds_a_flavour(make_project, monkeypatch, dangling_images,
                                               no_leaked_containers) -> None:
    monkeypatch.setenv(engine.buildkit.BUILDER_ENV, "classic")
    project = make_project("8.92.0")
    flavour = project.flavour("8.92.0")
    results = build.build_flavours(project.plan(), [flavour], BuildOptions(), _Quiet())
    assert results[0].outcome is Outcome.BUILT, results[0].message
    log = results[0].log.read_text()
    assert "builder: classic" in log and "Successfully built" in log
    found = _scan(engine.images.save_image_stream(names.local_ref(flavour.tag)), [project.ca_marker.encode()])
    assert not found[project.ca_marker.encode()]
    run = engine.containers.run_container(names.local_ref(flavour.tag), ["python", "-c", "import torch_xla, xla_smoke"],
                                          role="test")
    assert run.exit_code == 0, run.output
    assert not dangling_images()


@pytest.fixture
def own_registry(tmp_path: Path):
    """A docker-registry of this test's own (ci/registry.sh on a free port, state in tmp_path)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PORT": str(port), "XLA_IMAGES_STATE": str(tmp_path / "state")}
    script = Path(__file__).resolve().parents[2] / "ci" / "registry.sh"
    started = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        yield Registry.parse(f"127.0.0.1:{port}/xla-images-layers-test")
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, text=True, timeout=120)


def test_second_flavour_of_a_release_uploads_only_its_own_layer(pair, own_registry) -> None:
    client = publish.RegistryClient(own_registry)
    transfers: dict[str, publish.Transfer] = {}
    cpu, tpu = pair.flavour(RELEASE, "cpu"), pair.flavour(RELEASE, "tpu")
    lines: list[str] = []
    for flavour in (cpu, tpu):
        publish.push_flavour(flavour, own_registry, client, None, lines.append, transfers)
    first, second = transfers[cpu.tag], transfers[tpu.tag]
    assert first.present_layers == 0 and first.uploaded_layers == len(set(_layers(pair, "cpu")))
    # Only libtpu's layer is new to the registry; every other blob is found by digest and not sent.
    assert second.uploaded_layers == 1, second
    assert second.present_layers == first.uploaded_layers
    assert second.present_bytes == first.uploaded_bytes
    libtpu_blob = client.manifest(tpu.tag)["layers"][-2]
    assert second.uploaded_bytes == libtpu_blob["size"]
    assert any(f"{tpu.tag}: uploaded" in line and "already present" in line for line in lines), lines


def _cached_steps(log: str) -> list[str]:
    """RUN/COPY steps BuildKit's plain output marks CACHED (resolving the base image's metadata does not count)."""
    names = {}
    cached = set()
    for line in log.splitlines():
        number, _, rest = line.partition(" ")
        if rest.startswith("[") and ("] RUN " in rest or "] COPY " in rest):
            names[number] = rest
        elif rest.strip() == "CACHED":
            cached.add(number)
    return sorted(names[number] for number in cached if number in names)


def _scan(chunks, needles: list[bytes]) -> dict[bytes, bool]:
    found = {needle: False for needle in needles}
    overlap = max(len(needle) for needle in needles) - 1
    tail = b""
    for chunk in chunks:
        window = tail + chunk
        for needle in needles:
            found[needle] = found[needle] or needle in window
        tail = window[-overlap:]
    return found
