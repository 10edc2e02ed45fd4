"""Locks, the host wheelhouse and pip settings. Resolution runs real pip against a local file:// index of small
wheels made here, so these tests need no network and exercise the same code path as `build.py lock`."""
from __future__ import annotations

import dataclasses
import hashlib
import html
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from xla_images import names
from xla_images.errors import ConfigError, Failure
from xla_images.generate import sync
from xla_images.generate.plan import Plan, load_plan
from xla_images.model import lockfile
from xla_images.model.site import WheelSource, load_site
from xla_images.run.building import context
from xla_images.run.packages import lock as wheels, wheelhouse as hostwheels
from support.matrices import RELEASE_2_9_0

MATRIX = """\
schema: 1
defaults:
  pythons: ["3.11", "3.12"]
  accelerators: [tpu, cpu]
  latest_python: "3.11"
releases:
""" + RELEASE_2_9_0
ONE_PYTHON = MATRIX.replace('pythons: ["3.11", "3.12"]', 'pythons: ["3.11"]')

# name, version, Requires-Dist. The markers make the closure differ between the host (3.11) and python 3.12.
INDEX_WHEELS = [
    ("torch", "2.9.0", ["filelock", "sympy>=1.13", 'setuptools; python_version >= "3.12"',
                        'importlib-metadata; python_version < "3.10"', 'optree>=0.13; extra == "optree"']),
    ("torch_xla", "2.9.0", ["torch==2.9.0", "absl-py>=1.0", "requests[socks]"]),
    ("torch", "2.8.0", ["filelock"]),
    ("torch_xla", "2.8.1", ["torch==2.8.0"]),
    ("libtpu", "0.0.21", []),
    ("filelock", "3.0.0", []),
    ("filelock", "3.1.0", []),
    ("sympy", "1.13.0", ["mpmath<1.4"]),
    ("mpmath", "1.3.0", []),
    ("setuptools", "80.0.0", []),
    ("importlib_metadata", "8.0.0", []),
    ("optree", "0.13.0", []),
    ("absl_py", "2.0.0", []),
    ("requests", "2.32.0", ['pysocks!=1.5.7; extra == "socks"']),
    ("PySocks", "1.7.1", []),
]


def write_wheel(directory: Path, name: str, version: str, requires: list[str], requires_python: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Python: {requires_python}"] if requires_python else []
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    metadata += sorted({f"Provides-Extra: {r.split('extra == ')[1].strip(chr(34))}" for r in requires
                        if "extra ==" in r})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{dist_info}/METADATA", "\n".join(metadata) + "\n")
        archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_index(root: Path, specs=INDEX_WHEELS) -> Path:
    """A PEP 503 index on disk: simple/<project>/index.html linking files with #sha256= fragments."""
    files = root / "files"
    pages: dict[str, list[tuple[Path, str]]] = {}
    for name, version, requires, *python in specs:  # an optional fourth item: Requires-Python
        wheel = write_wheel(files, name, version, requires, *python)
        pages.setdefault(name.lower().replace("_", "-"), []).append((wheel, "".join(python)))
    for project, project_wheels in pages.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{wheel.name}#sha256={sha256(wheel)}"'
                        + (f' data-requires-python="{html.escape(python)}"' if python else "")
                        + f">{wheel.name}</a>\n" for wheel, python in project_wheels)
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root / "simple"


def project(tmp_path: Path, index: Path, matrix: str = MATRIX, extra: tuple[str, ...] = ()) -> Plan:
    (tmp_path / "matrix.yaml").write_text(matrix)
    overrides = ("ca_bundle=none", f'wheel_sources=[{{name: test-index, index_url: "{index.as_uri()}/"}}]', *extra)
    return load_plan(tmp_path / "matrix.yaml", overrides=overrides)


class CountingRunner:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command, **kwargs):
        self.commands.append(list(command))
        return subprocess.run(command, **kwargs)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("index"))


def lock_names(plan: Plan, tag: str) -> dict[str, str]:
    lock = lockfile.read_lock(plan.root / "Dockerfiles" / tag / names.LOCK_NAME)
    return {entry.name: entry.version for entry in lock.entries}


# --- the lock file format -----------------------------------------------------------------------------------

def test_lock_round_trip_and_sorting(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index)
    flavour = plan.flavours[0]
    entries = [lockfile.LockEntry("zipp", "3.23.1", "b" * 64, "zipp-3.23.1-py3-none-any.whl"),
               lockfile.LockEntry("torch", "2.6.0+cxx11", "a" * 64, "torch-2.6.0+cxx11-cp311-cp311-linux_x86_64.whl",
                                local=True)]
    text = lockfile.format_lock(flavour, "sha256:" + "c" * 64, entries)
    assert text.startswith("# Generated by xla-images (`./build.py lock`)")
    assert f"`./build.py lock {flavour.tag}`" in text
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert pins == [
        f"torch==2.6.0+cxx11 --hash=sha256:{'a' * 64}  # torch-2.6.0+cxx11-cp311-cp311-linux_x86_64.whl (wheelhouse)",
        f"zipp==3.23.1 --hash=sha256:{'b' * 64}  # zipp-3.23.1-py3-none-any.whl",
    ]
    parsed = lockfile.parse_lock(text)
    assert parsed.inputs == "sha256:" + "c" * 64
    assert parsed.entries == tuple(sorted(entries, key=lambda entry: entry.name))


@pytest.mark.parametrize("text, wanted", [
    ("# inputs: sha256:" + "0" * 64 + "\ntorch>=2.9\n", "lock.txt:2"),
    ("torch==2.9.0 --hash=sha256:" + "0" * 64 + "  # torch.whl\n", "no `# inputs"),
    ("# inputs: sha256:" + "0" * 64 + "\ntorch==2.9.0 --hash=sha256:abc  # torch.whl\n", "lock.txt:2"),
])
def test_malformed_locks_are_config_errors_with_a_line(text: str, wanted: str) -> None:
    with pytest.raises(ConfigError) as caught:
        lockfile.parse_lock(text, "lock.txt")
    assert wanted in caught.value.render()


def test_inputs_hash_tracks_every_input(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index)
    flavour = next(f for f in plan.flavours if f.tag == "r2.9.0_3.11_cpu")
    union = lockfile.group_requirements(plan.flavours, flavour)
    assert union == ("libtpu==0.0.21", "torch==2.9.0", "torch_xla==2.9.0")
    base = lockfile.lock_inputs(flavour, union)
    assert base == lockfile.lock_inputs(flavour, tuple(reversed(union)))  # order of the union does not matter
    variants = [
        lockfile.lock_inputs(flavour, ("torch==2.9.0", "torch_xla==2.9.0")),
        lockfile.lock_inputs(dataclasses.replace(flavour, python="3.12"), union),
        lockfile.lock_inputs(dataclasses.replace(flavour, torch="2.9.1"), union),
        lockfile.lock_inputs(dataclasses.replace(flavour, wheel_source=WheelSource("other")), union),
    ]
    assert len({base, *variants}) == 5


# --- pip settings for the build context ---------------------------------------------------------------------

def test_pip_conf_default_index_with_ca() -> None:
    text = context.pip_conf(WheelSource("default-index-cxx11"), ca=True, wheelhouse=False)
    assert text.splitlines()[1:] == ["[global]", "cert = /tmp/pip/ca.crt"]


def test_pip_conf_full_source_with_wheelhouse() -> None:
    source = WheelSource("mirror", index_url="https://mirror.test/simple",
                         extra_index_urls=("https://a.test/simple", "https://b.test/simple"),
                         find_links=("https://links.test/index.html", "/host/only/dir"), wheelhouse="wheelhouse/x")
    lines = context.pip_conf(source, ca=False, wheelhouse=True).splitlines()
    assert lines[1:] == ["[global]", "index-url = https://mirror.test/simple",
                         "extra-index-url = https://a.test/simple https://b.test/simple",
                         "find-links = /tmp/wheelhouse https://links.test/index.html"]
    assert not any("cert" in line or "/host/only" in line for line in lines)


def test_pip_conf_offline_uses_only_the_context_wheelhouse() -> None:
    source = WheelSource("mirror", index_url="https://mirror.test/simple", find_links=("https://links.test/",))
    lines = context.pip_conf(source, ca=True, wheelhouse=True, offline=True).splitlines()
    assert lines[1:] == ["[global]", "no-index = true", "find-links = /tmp/wheelhouse", "cert = /tmp/pip/ca.crt"]


# --- the closure under the target's markers -----------------------------------------------------------------

def report_items(specs) -> dict:
    return {name.lower().replace("_", "-"): {"metadata": {"name": name, "version": version, "requires_dist": req}}
            for name, version, req in specs}


@pytest.mark.parametrize("python, has, lacks", [
    ("3.12", {"setuptools"}, {"importlib-metadata"}),
    ("3.9", {"importlib-metadata"}, {"setuptools"}),
    ("3.11", set(), {"setuptools", "importlib-metadata"}),
])
def test_closure_evaluates_markers_for_the_target(python: str, has: set[str], lacks: set[str]) -> None:
    older = {("filelock", "3.0.0"), ("torch", "2.8.0"), ("torch_xla", "2.8.1")}
    latest = [spec for spec in INDEX_WHEELS if (spec[0], spec[1]) not in older]
    result = wheels.closure(report_items(latest), ["torch==2.9.0", "torch_xla==2.9.0"],
                            lockfile.target_environment(python))
    assert result.missing == [] and result.conflicts == []
    assert has <= set(result.names) and not lacks & set(result.names)
    assert {"pysocks", "requests", "absl-py", "mpmath"} <= set(result.names)  # extras followed
    assert "optree" not in result.names and "libtpu" not in result.names


def test_closure_reports_missing_and_conflicting_pins() -> None:
    items = report_items([("torch", "2.9.0", ['setuptools; python_version >= "3.12"', "sympy>=1.13"]),
                          ("sympy", "1.12.0", [])])
    result = wheels.closure(items, ["torch==2.9.0"], lockfile.target_environment("3.12"))
    assert result.missing == ["setuptools"]
    assert result.conflicts == ["torch 2.9.0 needs sympy>=1.13, resolved sympy 1.12.0"]


# --- locking with real pip against the local index ----------------------------------------------------------

def test_index_credentials_go_in_pips_environment_never_its_command_line(
        tmp_path: Path, index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command line is world-readable (/proc/PID/cmdline): index URLs with credentials go in pip's environment,
    which also keeps none of the host's PIP_* variables and no pip config file."""
    monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "host-constraints.txt"))
    monkeypatch.setenv("PIP_INDEX_URL", "https://host-index.example/simple")
    plan = project(tmp_path, index, extra=(
        'wheel_sources=[{name: private, index_url: "https://user:s3cretPass@pypi.corp.example/simple", '
        'extra_index_urls: ["https://user:0therPass@extra.corp.example/simple"], find_links: ["./my wheels"]}]',))
    seen: list[tuple[list[str], dict[str, str]]] = []

    def refusing(command, **kwargs):  # records what pip would get, then fails as an unreachable index would
        seen.append((list(command), dict(kwargs["env"])))
        return subprocess.CompletedProcess(command, 1, "", "ERROR: no index reachable")

    report = wheels.lock(plan, list(plan.flavours)[:1], jobs=1, resolver=wheels.Resolver(plan.site, runner=refusing))
    assert report.failed and seen
    command, environment = seen[0]
    assert not [arg for arg in command if "Pass" in arg or "corp.example" in arg], command
    assert environment["PIP_INDEX_URL"] == "https://user:s3cretPass@pypi.corp.example/simple"
    assert environment["PIP_EXTRA_INDEX_URL"] == "https://user:0therPass@extra.corp.example/simple"
    assert environment["PIP_FIND_LINKS"].startswith("file:///") and "my%20wheels" in environment["PIP_FIND_LINKS"]
    assert environment["PIP_CONFIG_FILE"] == os.devnull and "PIP_CONSTRAINT" not in environment
    assert "s3cretPass" not in str(report.failed)


def test_lock_resolves_each_group_once_with_target_markers(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index)
    runner = CountingRunner()
    report = wheels.lock(plan, list(plan.flavours), jobs=2, resolver=wheels.Resolver(plan.site, runner=runner))
    assert report.failed == () and report.skipped == ()
    assert sorted(result.tag for result in report.locked) == sorted(flavour.tag for flavour in plan.flavours)
    # Two groups (python 3.11, 3.12), each shared by tpu and cpu; 3.12 needs a second round for setuptools.
    # 3.11 (the release's lowest python) goes first; 3.12 is resolved with its python-independent pins too.
    assert len(runner.commands) == 3
    roots = [tuple(arg for arg in command if "==" in arg or arg == "setuptools") for command in runner.commands]
    group = ("libtpu==0.0.21", "torch==2.9.0", "torch_xla==2.9.0")
    pins = ("absl-py==2.0.0", "filelock==3.1.0", "mpmath==1.3.0", "pysocks==1.7.1", "requests==2.32.0",
            "sympy==1.13.0")
    assert roots == [group, group + pins, group + pins + ("setuptools",)]
    for command in runner.commands:
        assert "--dry-run" in command and "--only-binary=:all:" in command and "--index-url" not in command
        assert "--python-version" in command and "manylinux_2_28_x86_64" in command

    cpu311, tpu311 = lock_names(plan, "r2.9.0_3.11_cpu"), lock_names(plan, "r2.9.0_3.11_tpuvm")
    cpu312 = lock_names(plan, "r2.9.0_3.12_cpu")
    assert set(tpu311) - set(cpu311) == {"libtpu"}
    assert set(cpu312) - set(cpu311) == {"setuptools"}
    assert cpu311 == {"absl-py": "2.0.0", "filelock": "3.1.0", "mpmath": "1.3.0", "pysocks": "1.7.1",
                      "requests": "2.32.0", "sympy": "1.13.0", "torch": "2.9.0", "torch-xla": "2.9.0"}
    files = {path.name: sha256(path) for path in (index.parent / "files").iterdir()}
    for tag in ("r2.9.0_3.11_cpu", "r2.9.0_3.12_tpuvm"):
        for entry in lockfile.read_lock(plan.root / "Dockerfiles" / tag / names.LOCK_NAME).entries:
            assert files[entry.filename] == entry.sha256 and not entry.local
    fresh = load_plan(plan.matrix_path, overrides=project_overrides(index))
    assert all(lockfile.lock_status(fresh, f).state is lockfile.LockState.FRESH for f in fresh.flavours)
    assert not [finding for finding in sync.check(fresh) if finding.path.endswith(names.LOCK_NAME)]

    again = wheels.lock(fresh, [next(f for f in fresh.flavours if f.tag == "r2.9.0_3.11_cpu")])
    assert [(result.tag, result.changed, result.shared_with) for result in again.locked] == [
        ("r2.9.0_3.11_cpu", False, ())]


# A python-independent dependency whose newest release needs a newer python (networkx 3.7 needs >= 3.12).
ALIGN_WHEELS = [("torch", "2.9.0", ["filelock"]), ("torch_xla", "2.9.0", ["torch==2.9.0"]),
                ("libtpu", "0.0.21", []),
                ("filelock", "3.1.0", [], ">=3.10"), ("filelock", "3.2.0", [], ">=3.12")]


def test_a_release_s_pythons_lock_the_same_python_independent_wheels(tmp_path: Path) -> None:
    """Left alone, python 3.12 would take filelock 3.2.0; resolved with the pins of 3.11 (the release's lowest
    python) it takes 3.1.0 like 3.11 does, so their torch-any layers can be the same bytes."""
    index = make_index(tmp_path / "index", ALIGN_WHEELS)
    plan = project(tmp_path, index)
    free = wheels.Resolver(plan.site).resolve([next(f for f in plan.flavours if f.tag == "r2.9.0_3.12_cpu")],
                                              ("torch==2.9.0", "torch_xla==2.9.0"))
    assert {entry.name: entry.version for entry in free["r2.9.0_3.12_cpu"]}["filelock"] == "3.2.0"
    messages: list[str] = []
    report = wheels.lock(plan, list(plan.flavours), progress=messages.append)
    assert report.failed == ()
    assert {tag: lock_names(plan, tag)["filelock"] for tag in ("r2.9.0_3.11_cpu", "r2.9.0_3.12_cpu")} == {
        "r2.9.0_3.11_cpu": "3.1.0", "r2.9.0_3.12_cpu": "3.1.0"}
    flavour312 = next(f for f in plan.flavours if f.tag == "r2.9.0_3.12_cpu")
    assert lockfile.aligned_pins(plan, flavour312) == ("filelock==3.1.0",)  # roots (torch, libtpu...) excluded
    assert lockfile.aligned_pins(plan, next(f for f in plan.flavours if f.tag == "r2.9.0_3.11_cpu")) == ()
    assert all(lockfile.lock_status(plan, flavour).state is lockfile.LockState.FRESH for flavour in plan.flavours)
    assert not any("do not resolve here" in message for message in messages)


def test_pins_that_do_not_resolve_for_a_newer_python_fall_back_to_a_free_resolution(tmp_path: Path) -> None:
    """filelock 3.0.5 (what 3.11 locks) does not install on 3.12: 3.12 is resolved without the pins, says so,
    and its lock counts as fresh."""
    index = make_index(tmp_path / "index", [*ALIGN_WHEELS[:3], ("filelock", "3.0.5", [], "<3.12"),
                                            ("filelock", "3.1.0", [], ">=3.12")])
    plan = project(tmp_path, index)
    messages: list[str] = []
    report = wheels.lock(plan, list(plan.flavours), progress=messages.append)
    assert report.failed == ()
    assert lock_names(plan, "r2.9.0_3.11_cpu")["filelock"] == "3.0.5"
    assert lock_names(plan, "r2.9.0_3.12_cpu")["filelock"] == "3.1.0"
    assert any("r2.9.0_3.12_cpu" in message and "the python-independent pins of python 3.11 do not resolve here"
               in message for message in messages), messages
    assert all(lockfile.lock_status(plan, flavour).state is lockfile.LockState.FRESH for flavour in plan.flavours)


def test_a_changed_anchor_lock_makes_the_other_pythons_stale(tmp_path: Path) -> None:
    index = make_index(tmp_path / "index", ALIGN_WHEELS)
    plan = project(tmp_path, index)
    wheels.lock(plan, list(plan.flavours))
    anchor = plan.root / "Dockerfiles" / "r2.9.0_3.11_cpu" / names.LOCK_NAME
    anchor.write_text(anchor.read_text().replace("filelock==3.1.0", "filelock==3.0.9"))
    states = {flavour.tag: lockfile.lock_status(plan, flavour).state for flavour in plan.flavours}
    assert states["r2.9.0_3.12_cpu"] is lockfile.LockState.STALE
    assert states["r2.9.0_3.11_tpuvm"] is lockfile.LockState.FRESH  # the anchor python's own locks do not align


def project_overrides(index: Path) -> tuple[str, ...]:
    return ("ca_bundle=none", f'wheel_sources=[{{name: test-index, index_url: "{index.as_uri()}/"}}]')


def test_failures_do_not_stop_the_others_and_siblings_lock_alone(tmp_path: Path, index: Path) -> None:
    matrix = ONE_PYTHON + """\
  "2.8.1":
    torch: "2.8.0"
    pytorch_git_rev: v2.8.0
    xla_git_rev: v2.8.1
    python_support: ">=3.10,<3.14"
    libtpu: "0.0.17"
  "2.7.0":
    torch: "2.7.0"
    pytorch_git_rev: v2.7.0
    xla_git_rev: v2.7.0
    python_support: ">=3.9,<3.12"
    accelerators: [cpu]
"""
    plan = project(tmp_path, index, matrix)
    report = wheels.lock(plan, list(plan.flavours))
    # libtpu 0.0.17 and torch 2.7.0 are not in the index; the 2.8.1 cpu flavour needs neither.
    assert sorted(failure.tags for failure in report.failed) == [("r2.7.0_3.11_cpu",), ("r2.8.1_3.11_tpuvm",)]
    errors = {failure.tags[0]: failure.error for failure in report.failed}
    assert isinstance(errors["r2.7.0_3.11_cpu"], Failure)
    assert "torch==2.7.0" in errors["r2.7.0_3.11_cpu"].message and "test-index" in errors["r2.7.0_3.11_cpu"].message
    assert "libtpu==0.0.17" in errors["r2.8.1_3.11_tpuvm"].message
    assert sorted(result.tag for result in report.locked) == ["r2.8.1_3.11_cpu", "r2.9.0_3.11_cpu",
                                                              "r2.9.0_3.11_tpuvm"]
    assert not (tmp_path / "Dockerfiles" / "r2.7.0_3.11_cpu" / names.LOCK_NAME).exists()
    alone = next(flavour for flavour in plan.flavours if flavour.tag == "r2.8.1_3.11_cpu")
    assert lockfile.lock_status(plan, alone).state is lockfile.LockState.FRESH
    assert set(lock_names(plan, "r2.8.1_3.11_cpu")) == {"torch", "torch-xla", "filelock"}


def test_wheelhouse_source_is_locked_from_local_files(tmp_path: Path, index: Path) -> None:
    built = tmp_path / "wheelhouse" / "built"
    write_wheel(built, "torch", "2.9.0+precxx11", ["filelock"])
    write_wheel(built, "torch_xla", "2.9.0+precxx11", ["torch==2.9.0+precxx11", "absl-py"])
    matrix = MATRIX.replace('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    abis: [pre-cxx11]\n'
                            '    accelerators: [cpu]\n    pythons: ["3.11"]\n')
    overrides = ("ca_bundle=none", "wheel_sources=[{name: built, match: {abi: pre-cxx11}, "
                 f'wheelhouse: wheelhouse/built, index_url: "{index.as_uri()}/", '
                 'torch_local: "+precxx11", torch_xla_local: "+precxx11"}]')
    (tmp_path / "matrix.yaml").write_text(matrix)
    plan = load_plan(tmp_path / "matrix.yaml", overrides=overrides)
    (flavour,) = plan.flavours
    assert flavour.tag == "r2.9.0_3.11_cpu_precxx11"
    report = wheels.lock(plan, [flavour])
    assert report.failed == ()
    entries = lockfile.read_lock(plan.lock_path(flavour)).by_name()
    assert entries["torch"].local and entries["torch"].version == "2.9.0+precxx11"
    assert entries["torch"].sha256 == sha256(built / "torch-2.9.0+precxx11-py3-none-any.whl")
    assert not entries["filelock"].local
    assert "(wheelhouse)" in plan.lock_path(flavour).read_text()


# --- the host wheelhouse ------------------------------------------------------------------------------------

def test_fetch_downloads_each_wheel_once_and_verifies(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index, ONE_PYTHON)
    wheels.lock(plan, list(plan.flavours))
    plan = load_plan(plan.matrix_path, overrides=project_overrides(index))
    house = tmp_path / "house"
    result = hostwheels.fetch(plan, list(plan.flavours), house)
    every = {entry.filename: entry.sha256 for flavour in plan.flavours
             for entry in lockfile.read_lock(plan.lock_path(flavour)).entries}
    assert sorted(result.downloaded) == sorted(every)  # shared wheels once
    assert {path.name: sha256(path) for path in house.iterdir()} == every
    again = hostwheels.fetch(plan, list(plan.flavours), house)
    assert again.downloaded == () and again.present == sum(
        len(lockfile.read_lock(plan.lock_path(flavour)).entries) for flavour in plan.flavours)
    corrupt = house / "torch-2.9.0-py3-none-any.whl"
    corrupt.write_bytes(b"not the locked file")
    repaired = hostwheels.fetch(plan, list(plan.flavours), house)
    assert repaired.downloaded == ("torch-2.9.0-py3-none-any.whl",)
    assert sha256(corrupt) == every[corrupt.name]

    flavour = next(f for f in plan.flavours if f.tag == "r2.9.0_3.11_cpu")
    inputs = context.context_inputs(plan, flavour, house)
    assert inputs.offline and len(inputs.wheels) == len(lockfile.read_lock(plan.lock_path(flavour)).entries)
    assert "no-index = true" in inputs.pip_conf and inputs.ca_bundle is None


def test_wheels_for_finds_locked_files_and_insists_on_local_ones(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index)
    flavour = plan.flavours[0]
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        write_wheel(folder, "a", "1.0", [])
    write_wheel(second, "b", "1.0", [])
    lock = lockfile.Lock("sha256:" + "0" * 64, (
        lockfile.LockEntry("a", "1.0", "0" * 64, "a-1.0-py3-none-any.whl"),
        lockfile.LockEntry("b", "1.0", "0" * 64, "b-1.0-py3-none-any.whl"),
        lockfile.LockEntry("c", "1.0", "0" * 64, "c-1.0-py3-none-any.whl"),
    ))
    found = hostwheels.wheels_for(flavour, lock, [first, second])
    assert found == [first / "a-1.0-py3-none-any.whl", second / "b-1.0-py3-none-any.whl"]
    local = lockfile.Lock(lock.inputs, (*lock.entries, lockfile.LockEntry("d", "1.0", "0" * 64, "d-1.0.whl", True)))
    with pytest.raises(Failure) as caught:
        hostwheels.wheels_for(flavour, local, first)
    assert "d-1.0.whl" in caught.value.message
    assert f"wheel-builds/build-wheels.sh {flavour.wheel_build.name} " in caught.value.hint


def test_fetch_refuses_a_missing_wheelhouse_wheel(tmp_path: Path, index: Path) -> None:
    plan = project(tmp_path, index)
    flavour = plan.flavours[0]
    entry = lockfile.LockEntry("torch", "2.9.0+precxx11", "0" * 64, "torch-2.9.0+precxx11-py3-none-any.whl", True)
    plan.lock_path(flavour).parent.mkdir(parents=True)
    plan.lock_path(flavour).write_text(lockfile.format_lock(flavour, "sha256:" + "0" * 64, [entry]))
    with pytest.raises(Failure) as caught:
        hostwheels.fetch(plan, [flavour], tmp_path / "house")
    assert caught.value.rule == "wheelhouse-complete"


def test_a_wheel_cache_number_past_the_digit_bound_is_refused_before_conversion(tmp_path) -> None:
    """Issue 41: integers in JSON files are bounded before int() (json.loads' parse_int), named, never converted."""
    from xla_images.errors import ConfigError
    from xla_images.model import wheel_index

    path = tmp_path / wheel_index.WHEELS_FILE
    path.write_text('{"schema": ' + "1" * 5000 + ', "index": "x", "wheels": {}}')
    with pytest.raises(ConfigError) as caught:
        wheel_index.load(path)
    assert caught.value.rule == "wheel-cache" and "a number of 5000 digits" in caught.value.message


def test_a_local_wheel_pip_gave_no_hash_for_is_hashed_from_the_file(tmp_path: Path) -> None:
    """pip's report may carry no sha256 for a file: URL (a wheelhouse, a local find-links folder): the lock takes
    the file's own, and marks the entry local (the build context copies it)."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a zip, only bytes to hash")
    item = {"download_info": {"url": wheel.as_uri(), "archive_info": {}},
            "metadata": {"name": "Demo", "version": "1.0"}}
    entry = wheels.Resolver(load_site(None))._entry(item, [tmp_path])
    assert entry.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (entry.name, entry.version, entry.filename, entry.local) == ("demo", "1.0", wheel.name, True)
