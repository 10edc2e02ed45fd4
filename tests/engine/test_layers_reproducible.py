"""Layered, reproducible images through BuildKit, on the real engine, with tiny local wheels.

* the cpu and tpu flavours of one release share every layer but libtpu's (the only extra wheel layer) and their
  own derived layer (constraints and xla-images-check, last);
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

from reporters import QuietReporter
from save_scan import scan
from xla_images import settings
from xla_images import names
from xla_images.model import lockfile
from xla_images.model.registry import Registry
from xla_images.run.building import build
from xla_images.run import engine
from xla_images.run import registry as registries
from xla_images.run.shipping import publish
from xla_images.run.packages import lock as wheels
from xla_images.run.building.build import BuildOptions, Outcome

RELEASE = "8.91.0"


@pytest.fixture(scope="module")
def pair(make_project):
    """The tpu and cpu flavours of one release, built together (two at a time) through BuildKit."""
    if not engine.buildkit.use_buildkit(settings.read_builder()):
        pytest.skip(f"BuildKit is not usable here: {engine.buildkit.buildx_info().problem}")
    project = make_project(RELEASE, accelerators=("tpu", "cpu"), payload=b"x" * (1 << 20))
    plan = project.plan()
    results = build.build_flavours(plan, list(plan.flavours), BuildOptions(jobs=2), QuietReporter())
    assert [result.outcome for result in results] == [Outcome.BUILT] * 2, [result.message for result in results]
    return project


def _layers(project, accelerator: str) -> list[str]:
    return engine.images.image_layers(names.local_ref(project.flavour(RELEASE, accelerator).tag))


def test_cpu_and_tpu_share_every_layer_but_libtpus(pair, test_base: str) -> None:
    cpu, tpu = _layers(pair, "cpu"), _layers(pair, "tpu")
    base = engine.images.image_layers(test_base)
    assert cpu[:len(base)] == tpu[:len(base)] == base
    # The last layer of each is its own: the derived layer (constraints.txt from its lock, which pins libtpu only
    # for tpu, and xla-images-check). Every other layer of cpu is tpu's, and tpu adds libtpu's alone.
    assert cpu[-1] != tpu[-1], "the derived layers should differ: the constraints pin libtpu for tpu only"
    only_tpu = [layer for layer in tpu[:-1] if layer not in cpu]
    assert len(only_tpu) == 1, f"tpu has {len(only_tpu)} wheel layers cpu lacks: {only_tpu}"
    assert [layer for layer in tpu[:-1] if layer != only_tpu[0]] == cpu[:-1], "the shared layers are not in order"
    # libtpu's layer is the last wheel layer: only the smoke suite's and the derived layer come after it.
    assert tpu.index(only_tpu[0]) == len(tpu) - 3
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
    results = build.build_flavours(pair.plan(), [flavour], BuildOptions(force=True, no_cache=True), QuietReporter())
    assert results[0].outcome is Outcome.BUILT, results[0].message
    log = results[0].log.read_text()
    assert not _cached_steps(log), f"--no-cache still took steps from the build cache: {_cached_steps(log)}"
    after = _layers(pair, "tpu")
    assert len(after) == len(before)
    differing = [index for index, (old, new) in enumerate(zip(before, after)) if old != new]
    assert not differing, f"layers {differing} of {len(before)} changed in a rebuild of the same inputs"


def test_no_layer_holds_the_ca_or_the_pip_settings(pair) -> None:
    flavour = pair.flavour(RELEASE, "tpu")
    found = scan(engine.images.save_image_stream(names.local_ref(flavour.tag)),
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
    results = build.build_flavours(project.plan(), [flavour], BuildOptions(), QuietReporter())
    assert results[0].outcome is Outcome.BUILT, results[0].message
    log = results[0].log.read_text()
    assert "builder: classic" in log and "Successfully built" in log
    found = scan(engine.images.save_image_stream(names.local_ref(flavour.tag)), [project.ca_marker.encode()])
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
    client = registries.RegistryClient(own_registry)
    transfers: dict[str, publish.Transfer] = {}
    cpu, tpu = pair.flavour(RELEASE, "cpu"), pair.flavour(RELEASE, "tpu")
    lines: list[str] = []
    compression = pair.plan().site.compression  # what the builds stored on a containerd-store engine
    for flavour in (cpu, tpu):
        publish.push_flavour(flavour, own_registry, client, None, lines.append, transfers, compression)
    first, second = transfers[cpu.tag], transfers[tpu.tag]
    assert first.present_layers == 0 and first.uploaded_layers == len(set(_layers(pair, "cpu")))
    # Only libtpu's layer and tpu's own derived layer (its constraints) are new to the registry; every other
    # blob is found by digest and not sent.
    cpu_layers, tpu_layers = client.manifest(cpu.tag)["layers"], client.manifest(tpu.tag)["layers"]
    assert second.uploaded_layers == 2, second
    assert second.present_layers == first.uploaded_layers - 1
    assert second.present_bytes == first.uploaded_bytes - cpu_layers[-1]["size"]
    libtpu_blob, derived_blob = tpu_layers[-3], tpu_layers[-1]
    assert second.uploaded_bytes == libtpu_blob["size"] + derived_blob["size"]
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



# Prints one JSON line per entry of the venv (and of what it links into PURE_DIR): path, kind, mode, content.
# A relocated entry (site-packages/x -> /opt/xla-images/any/x) is followed, so a layered image and a plain
# install describe the same tree; the image's own additions (layer manifests, the smoke suite, xla-images-check)
# are left out.
MANIFEST = r"""
import hashlib, json, os, stat, sys
venv, pure, skip = "/opt/venv", "/opt/xla-images/any", ("xla-images-layers", "xla_smoke", "xla-images-check")
def entry(shown, real):
    info = os.lstat(real)
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(real)
        if os.path.realpath(real).startswith(pure + "/"):
            return entry(shown, os.path.realpath(real))
        return print(json.dumps([shown, "symlink", target]))
    if stat.S_ISDIR(info.st_mode):
        return walk(shown, real)
    with open(real, "rb") as handle:
        data = handle.read()
    if shown == venv + "/pyvenv.cfg":  # its `command` line records how the venv was made (with or without pip)
        data = b"".join(line for line in data.splitlines(True) if not line.startswith(b"command"))
    digest = hashlib.sha256(data).hexdigest()
    print(json.dumps([shown, "file", oct(stat.S_IMODE(info.st_mode)), digest]))
def walk(shown, real):
    print(json.dumps([shown, "directory", oct(stat.S_IMODE(os.lstat(real).st_mode))]))
    for name in sorted(os.listdir(real)):
        # The image's own additions: the layers dir, the smoke suite, the check tool and the any-UID start-up hook
        # (xla_images_home.py, its .pth and the .pyc the first python of the image leaves; docs/running.md).
        if name not in skip and not name.startswith("xla_images_home."):
            entry(shown + "/" + name, real + "/" + name)
walk(venv, venv)
"""


def _manifest(output: str) -> dict[str, list]:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("[")]
    return {line[0]: line[1:] for line in lines}


def test_layers_apply_cleanly_and_equal_a_plain_install_of_the_lock(make_project, wheel_maker, test_base: str,
                                                                    no_leaked_containers) -> None:
    """A lock that replaces what the venv's bootstrap installed (setuptools, upgraded: a directory of the old one
    is a file in the new one, a .pth file, a script in bin/), the shape that stopped 2.7.0 and 2.8.1 building:
    every layer applies, and the image's venv is file for file, mode for mode, a plain `pip install` of the lock
    into the same base."""
    release = "8.94.0"
    project = make_project(release)
    wheelhouse = project.root / "wheelhouse"
    wheel_maker(wheelhouse, "torch", release, requires=("setuptools>=99",))
    wheel_maker(wheelhouse, "setuptools", "999.0", files={
        "_distutils_hack/__init__.py": b"# the upgraded setuptools\n",
        "pkg_resources": b"a file where setuptools 66 has a directory\n",
        "distutils-precedence.pth": b"# a .pth file (a comment: nothing to run)\n",
        "setuptools-999.0.data/scripts/easy-tool": b"#!python\nprint('tool')\n",
    })
    plan = project.plan()
    flavour = project.flavour(release)
    entries = [lockfile.LockEntry(name, version, wheels.file_sha256(wheelhouse / filename), filename, local=True)
               for name, version, filename in [
                   ("setuptools", "999.0", "setuptools-999.0-py3-none-any.whl"),
                   ("torch", release, f"torch-{release}-py3-none-any.whl"),
                   ("torch-xla", release, f"torch_xla-{release}-py3-none-any.whl")]]
    inputs = lockfile.lock_inputs(flavour, lockfile.group_requirements(plan.flavours, flavour))
    lock_path = plan.lock_path(flavour)
    lock_path.write_text(lockfile.format_lock(flavour, inputs, entries), encoding="utf-8")

    results = build.build_flavours(project.plan(), [flavour], BuildOptions(), QuietReporter())
    assert results[0].outcome is Outcome.BUILT, results[0].message
    log = results[0].log.read_text()
    assert "layer venv-bootstrap: " in log and "wheel(s): pip\n" in log.replace("\r", "")
    layered = engine.containers.run_container(names.local_ref(flavour.tag), ["python", "-c", MANIFEST], role="test")
    assert layered.exit_code == 0, layered.output

    plain = subprocess.run([
        "docker", "run", "--rm", "--network", "none",
        "-v", f"{wheelhouse}:/wh:ro", "-v", f"{lock_path.parent}:/lock:ro",
        "-e", "SOURCE_DATE_EPOCH=315532800", "-e", "PYTHONHASHSEED=0", "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "--label", f"io.xla-images.test-session=plain-{release}", test_base, "sh", "-c",
        "python3.11 -m venv /opt/venv && /opt/venv/bin/python -m pip install -q --no-index --find-links /wh"
        " --require-hashes --only-binary=:all: -r /lock/requirements.lock"
        # The image's venv directories are group-0 writable (any UID in group 0 may pip install; running.md).
        " && find /opt/venv -type d -exec chmod g+w {} + && /opt/venv/bin/python -c \"$0\"", MANIFEST],
        capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    image, reference = _manifest(layered.output), _manifest(plain.stdout)
    assert reference["/opt/venv/lib/python3.11/site-packages/pkg_resources"][0] == "file", "control: the upgrade"
    assert "/opt/venv/bin/easy-tool" in reference and "/opt/venv/lib/python3.11/site-packages/pip" in reference
    missing = sorted(set(reference) - set(image))
    extra = sorted(set(image) - set(reference))
    differing = sorted(path for path in set(image) & set(reference) if image[path] != reference[path])
    assert not missing and not extra and not differing, (missing[:10], extra[:10],
                                                         [(p, image[p], reference[p]) for p in differing[:10]])
