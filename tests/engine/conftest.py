"""Shared fixtures for tests against the real Docker engine.

* `docker_engine` (autouse): skip when no engine answers, unless CI is set: then that is a failure.
* `bootstrapped_base`: `xla-images/base:3.11`, bootstrapped with base.py (debootstrap) if absent.
* `test_base`: that base plus a per-session label. Every container and image derived from it inherits the
  label, which is how `no_leaked_containers` and the clean-up find exactly this session's, even while other
  suites use the same engine.
* `make_project`: a throw-away repository (matrix, site, rendered Dockerfiles, locks) whose
  flavours install tiny locally built `torch` / `torch_xla` wheels from a local wheelhouse, so a build takes
  seconds and exercises the real Dockerfile and orchestration. Its releases are versions no real matrix has.
* `plain_install`: the wheel of this checkout installed into a fresh venv outside it (plain_install.py).
"""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import plain_install as plain_install_module
import pytest
from reporters import RecordingReporter
from second_engine_support import running_second_engine

from xla_images import names
from xla_images.errors import Failure
from xla_images.generate.plan import Plan, load_plan
from xla_images.model import lockfile
from xla_images.model.flavour import Flavour
from xla_images.run.building import base
from xla_images.run import engine
from xla_images.run.packages import lock as wheels

REPO = Path(__file__).resolve().parents[2]
SESSION_LABEL = "io.xla-images.test-session"
TEST_PYTHON = "3.11"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session", autouse=True)
def docker_engine():
    """The engine's client; skip (locally) or fail (CI) when none answers."""
    try:
        return engine.connection.client()
    except Failure as error:
        if in_ci():
            pytest.fail(f"CI needs a Docker engine: {error.message}")
        pytest.skip(f"no Docker engine: {error.message}")


@pytest.fixture(scope="session")
def bootstrapped_base() -> base.BaseImage:
    """`xla-images/base:3.11`, made with `build.py base` machinery when this engine has none (~2 min)."""
    found = base.find_base(TEST_PYTHON)
    if found is not None:
        return found
    try:
        return base.ensure_base(TEST_PYTHON, say=lambda line: print(line, file=sys.stderr))
    except Failure as error:
        pytest.fail(f"cannot bootstrap {base.base_ref(TEST_PYTHON)}: {error.render()}")


@pytest.fixture(scope="session")
def session_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def test_base(bootstrapped_base: base.BaseImage, session_id: str, tmp_path_factory) -> Iterator[str]:
    """The bootstrapped base with this session's label (no new layer: same layers, new config)."""
    context = tmp_path_factory.mktemp("test-base")
    (context / "Dockerfile").write_text(f"FROM {bootstrapped_base.ref}\nLABEL {SESSION_LABEL}={session_id}\n")
    ref = f"xla-images-test/base:{TEST_PYTHON}-{session_id}"
    engine.classic.build_directory(context, ref)
    yield ref
    remove_session_images(session_id)


def session_containers(session_id: str) -> list[dict]:
    return engine.connection.api().containers(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})


def session_dangling_images(session_id: str) -> list[dict]:
    return engine.connection.api().images(filters={"dangling": True, "label": f"{SESSION_LABEL}={session_id}"})


def remove_session_images(session_id: str) -> None:
    """Every image of this session: tagged ones by name (all their tags), then whatever is left, the classic
    builder's intermediate images included: the containerd store keeps them when their child goes, and only
    `all=True` lists them. A pass removes what no other image depends on, so a chain takes a pass per link."""
    session = {"label": f"{SESSION_LABEL}={session_id}"}
    for item in engine.connection.api().images(filters=session):
        for name in item.get("RepoTags") or []:
            if name != "<none>:<none>":
                engine.images.remove_tag(name)
    problems: list[str] = []
    for _ in range(20):
        left = engine.connection.api().images(all=True, filters=session)
        if not left:
            return
        problems = []
        for item in left:
            try:
                engine.images.remove_image(item["Id"], force=True)
            except Failure as error:  # go on: one stuck image must not keep the others
                problems.append(error.message)
    assert not engine.connection.api().images(all=True, filters=session), problems


@pytest.fixture
def reporter() -> RecordingReporter:
    return RecordingReporter()


@pytest.fixture
def dangling_images(session_id: str) -> Callable[[], list[dict]]:
    """New untagged, childless images of this session since the test began: what a failed or interrupted
    build must not leave behind."""
    before = {item["Id"] for item in session_dangling_images(session_id)}
    return lambda: [item for item in session_dangling_images(session_id) if item["Id"] not in before]


@pytest.fixture
def no_leaked_containers(session_id: str) -> Iterator[Callable[[], None]]:
    """Asserts, after the test (and whenever the test calls it), that no container of this session exists."""

    def check() -> None:
        leaked = session_containers(session_id)
        assert not leaked, "leaked containers: " + ", ".join(
            f"{item['Id'][:12]} ({item['State']}, {item.get('Command', '')[:60]})" for item in leaked)

    yield check
    check()


# --- tiny wheels and throw-away projects ------------------------------------------------------------------

def make_wheel(directory: Path, name: str, version: str, *, marker: str = "", payload: bytes = b"",
               module_version: str | None = None, requires: tuple[str, ...] = (),
               files: dict[str, bytes] | None = None) -> Path:
    """A real, installable py3-none-any wheel: package, dist-info (METADATA, WHEEL, RECORD with hashes).

    `module_version` makes the package's `__version__` differ from the distribution's (a stale build in a
    freshly named wheel, as upstream once shipped in a nightly). `requires`: its Requires-Dist lines; `files`:
    more files (path in the wheel -> bytes).
    """
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{name}/__init__.py": f"__version__ = {module_version or version!r}\nMARKER = {marker!r}\n".encode(),
        # A top-level module too (its .pyc lands in site-packages/__pycache__, which every wheel shares).
        f"{name}_top.py": f"NAME = {name!r}\n".encode(),
        **(files or {}),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: xla-images-tests\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n",
    }
    if payload:
        files[f"{name}/payload.bin"] = payload
    record = [f"{path},sha256={_record_hash(data)},{len(data)}" for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    # Stored, not deflated: a large random payload would not shrink anyway, and installing it stays I/O bound.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture(scope="session")
def wheel_maker() -> Callable[..., Path]:
    """make_wheel, for tests that need wheels of their own (nightly and stale builds)."""
    return make_wheel


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass
class Project:
    """A repository of its own: matrix.yaml, site.yaml, wheelhouse/, Dockerfiles/<tag>/."""

    root: Path
    # Random strings: one only in the CA bundle, one only in the torch wheels (a control for layer scans).
    ca_marker: str
    wheel_marker: str

    @property
    def matrix(self) -> Path:
        return self.root / "matrix.yaml"

    def plan(self) -> Plan:
        return load_plan(self.matrix, self.root / "site.yaml")

    def flavours(self) -> list[Flavour]:
        return list(self.plan().flavours)

    def flavour(self, version: str, accelerator: str = "cpu") -> Flavour:
        return next(flavour for flavour in self.plan().flavours
                    if flavour.torch_xla == version and flavour.accelerator.value == accelerator)

    def write_wheels(self, version: str, *, payload: bytes = b"") -> None:
        """Wheels torch, torch_xla (and libtpu) at `version`, then the flavours' rendered files and locks."""
        for name in ("torch", "torch_xla", "libtpu"):
            make_wheel(self.root / "wheelhouse", name, version, marker=f"{self.wheel_marker}-{name}-{version}",
                       payload=payload if name == "torch" else b"")
        self.write_locks()

    def write_locks(self) -> None:
        plan = self.plan()
        for flavour in plan.flavours:
            directory = plan.flavour_dir(flavour)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "Dockerfile").write_text(plan.rendered[flavour.tag]["Dockerfile"], encoding="utf-8")
            entries = []
            for name in ("torch", "torch_xla", *(["libtpu"] if flavour.libtpu else [])):
                wheel = self.root / "wheelhouse" / f"{name}-{flavour.torch_xla}-py3-none-any.whl"
                if wheel.is_file():
                    entries.append(lockfile.LockEntry(name.replace("_", "-"), flavour.torch_xla,
                                                    wheels.file_sha256(wheel), wheel.name, local=True))
            inputs = lockfile.lock_inputs(flavour, lockfile.group_requirements(plan.flavours, flavour))
            plan.lock_path(flavour).write_text(lockfile.format_lock(flavour, inputs, entries), encoding="utf-8")

    def use_base(self, ref: str) -> None:
        """Make the site's base for python 3.11 `ref` (site.yaml `bases`)."""
        site = self.root / "site.yaml"
        lines = site.read_text(encoding="utf-8").splitlines()
        index = next(number for number, line in enumerate(lines) if line.strip().startswith(f'"{TEST_PYTHON}":'))
        lines[index] = f'  "{TEST_PYTHON}": {ref}'
        site.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def break_lock(self, version: str) -> None:
        """Make pip refuse the flavour's torch wheel: a wrong sha256 (the lock stays well-formed and fresh)."""
        path = self.plan().lock_path(self.flavour(version))
        text = path.read_text(encoding="utf-8")
        lines = [line.replace(line.split("sha256:")[1][:64], "0" * 64) if line.startswith("torch==") else line
                 for line in text.splitlines()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def image_id(self, version: str) -> str | None:
        attrs = engine.images.image_inspect(names.local_ref(self.flavour(version).tag))
        return None if attrs is None else str(attrs["Id"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`build.py COMMAND --matrix <this project> ARGS...` as CI runs it (plain output)."""
        return subprocess.run(self.cli_command(*args), cwd=self.root, env=cli_env(), capture_output=True,
                              text=True, timeout=900)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.cli_command(*args), cwd=self.root, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def cli_command(self, *args: str) -> list[str]:
        return [sys.executable, str(REPO / "build.py"), *args[:1], "--matrix", str(self.matrix), *args[1:]]


def cli_env() -> dict[str, str]:
    return {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="session")
def make_project(tmp_path_factory, test_base: str) -> Callable[..., Project]:
    """make_project("8.71.0", "8.72.0"): a project whose releases are these versions (cpu, python 3.11).

    Session-scoped so module-scoped fixtures can use it too; each call makes a new project.
    """

    def make(*versions: str, payload: bytes = b"", accelerators: tuple[str, ...] = ("cpu",)) -> Project:
        root = tmp_path_factory.mktemp("project")
        ca_marker = "XLAIMAGESTESTCA" + uuid.uuid4().hex
        (root / "test-ca.pem").write_text(
            f"-----BEGIN CERTIFICATE-----\n{ca_marker}\n-----END CERTIFICATE-----\n", encoding="ascii")
        (root / "matrix.yaml").write_text(_matrix(versions, accelerators), encoding="utf-8")
        (root / "site.yaml").write_text(textwrap.dedent(f"""\
            registry: 127.0.0.1:5000/xla-images-test
            ca_bundle: test-ca.pem
            bases:
              "{TEST_PYTHON}": {test_base}
            wheel_sources:
              - name: test-wheelhouse
                match: {{torch_xla: ">=0"}}
                wheelhouse: wheelhouse
            """), encoding="utf-8")
        (root / "wheelhouse").mkdir()
        project = Project(root, ca_marker, "XLAIMAGESTESTWHEEL" + uuid.uuid4().hex)
        for version in versions:
            project.write_wheels(version, payload=payload)
        return project

    return make


def _matrix(versions: tuple[str, ...], accelerators: tuple[str, ...] = ("cpu",)) -> str:
    # tpu flavours pin a libtpu of the release's own version (a tiny wheel like the others).
    releases = "".join(textwrap.indent(textwrap.dedent(f"""\
        "{version}":
          torch: "{version}"
          pytorch_git_rev: v{version}
          xla_git_rev: v{version}
          python_support: ">=3.11,<3.12"
        """) + (f'  libtpu: "{version}"\n' if "tpu" in accelerators else ""), "  ") for version in versions)
    # No `latest` tags: a test must never move the real `latest` tags of a shared engine.
    return textwrap.dedent("""\
        schema: 1
        defaults:
          pythons: ["3.11"]
          accelerators: [ACCELERATORS]
          default_abi: cxx11
          abis: [cxx11]
          latest_python: none
        releases:
        """).replace("ACCELERATORS", ", ".join(accelerators)) + releases


@pytest.fixture(scope="session")
def plain_install(tmp_path_factory) -> "plain_install_module.PlainInstall":
    """xla-images built as a wheel and installed (not editable, no extras) into a fresh venv outside the checkout.

    Path-like: the venv's `xla-images` executable; `.run(*args, cwd=...)` runs it without PYTHONPATH.
    """
    return plain_install_module.install(tmp_path_factory.mktemp("plain-install"))


@pytest.fixture(scope="module")
def second_engine() -> Iterator[dict[str, float | bool]]:
    """ci/second-engine.sh's engine (context `xla-images-second`), running; stopped after the module when this
    started it (second_engine_support)."""
    yield from running_second_engine()
