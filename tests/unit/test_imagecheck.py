"""The derived-image layer: constraints.txt rendered from the lock (PIP_CONSTRAINT, labels, id) and the
`xla-images-check` zipapp (its members, its facts, its exit codes on small fake venvs; the real venv is
tests/xla/test_image_check.py's)."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from xla_images import abi, layers
from xla_images.abi import standalone
from xla_images.generate import plan as plan_module
from xla_images.generate import render
from xla_images.imagecheck import read_pins
from xla_images.imagecheck import check as imagecheck
from xla_images.model.flavour import COMPANIONS
from xla_images.model.lockfile import LockEntry, constraints_digest, format_constraints, format_lock, parse_lock
from xla_images.model.target import content_id
from xla_images.names import (CONSTRAINTS_LABEL, CONSTRAINTS_NAME, CONSTRAINTS_SHA256_LABEL, IMAGE_CONSTRAINTS,
                              VENV)
from xla_images.run.building.check_tool import SHEBANG, check_tool_bytes, write_check_tool

from golden import fixed_flavours

ROOT = Path(__file__).resolve().parents[2]
TAG = "r2.9.0_3.11_tpuvm"


def lock_text(flavour, extra: dict[str, str] | None = None) -> str:
    pins = {"torch": "2.9.0", "torch_xla": "2.9.0", "libtpu": "0.0.21", "numpy": "2.4.6", **(extra or {})}
    entries = [LockEntry(name.replace("_", "-"), version, f"{index:064x}", f"{name}-{version}-py3-none-any.whl")
               for index, (name, version) in enumerate(sorted(pins.items()))]
    return format_lock(flavour, "sha256:" + "0" * 64, entries)


# --- constraints.txt ------------------------------------------------------------------------------------------

def test_constraints_are_every_lock_pin_without_hashes() -> None:
    flavour = fixed_flavours()[TAG]
    text = format_constraints(flavour, lock_text(flavour))
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert pins == ["libtpu==0.0.21", "numpy==2.4.6", "torch==2.9.0", "torch-xla==2.9.0"]
    assert "--hash" not in text  # a hash would put pip in hash-checking mode for every derived install
    assert len(pins) == len(parse_lock(lock_text(flavour)).entries)


def test_without_a_lock_the_constraints_are_the_flavours_pins() -> None:
    flavour = fixed_flavours()[TAG]
    pins = [line for line in format_constraints(flavour, "").splitlines() if not line.startswith("#")]
    assert pins == ["torch==2.9.0", "torch_xla==2.9.0", "libtpu==0.0.21"]
    assert pins == [line for line in format_constraints(flavour, "not a lock\n").splitlines()
                    if not line.startswith("#")]


COMPANION_VERSIONS = (("torchvision", "0.24.0"), ("torchaudio", "2.9.0"))


def test_recorded_companions_are_pinned_in_the_constraints_only() -> None:
    """`pip install torchvision` in a derived image takes the one built for the image's torch; the lock (what the
    image installs) does not change, and installed companions are pinned once, from the lock."""
    flavour = dataclasses.replace(fixed_flavours()[TAG], companion_versions=COMPANION_VERSIONS)
    lock = lock_text(flavour)
    pins = [line for line in format_constraints(flavour, lock).splitlines() if not line.startswith("#")]
    assert pins == ["libtpu==0.0.21", "numpy==2.4.6", "torch==2.9.0", "torch-xla==2.9.0", "torchvision==0.24.0",
                    "torchaudio==2.9.0"]
    before = [line for line in format_constraints(fixed_flavours()[TAG], lock).splitlines()
              if not line.startswith("#")]
    assert pins[:len(before)] == before
    without_lock = [line for line in format_constraints(flavour, "").splitlines() if not line.startswith("#")]
    assert without_lock[-2:] == ["torchvision==0.24.0", "torchaudio==2.9.0"]
    installed = dataclasses.replace(flavour, companions=("torchvision",))
    lock = lock_text(installed, {"torchvision": "0.24.0", "pillow": "12.0.0"})
    pins = [line for line in format_constraints(installed, lock).splitlines() if not line.startswith("#")]
    assert pins.count("torchvision==0.24.0") == 1 and pins[-1] == "torchaudio==2.9.0"
    without_lock = [line for line in format_constraints(installed, "").splitlines() if not line.startswith("#")]
    assert without_lock.count("torchvision==0.24.0") == 1


def test_companions_in_another_abi_say_their_extensions_do_not_load() -> None:
    flavour = dataclasses.replace(fixed_flavours()["r2.6.0_3.11_cpu_cxx11"],
                                  companion_versions=(("torchvision", "0.21.0"),))
    text = format_constraints(flavour, "")
    assert "torchvision==0.21.0" in text.splitlines() and "pre-C++11" in text and "xla-images-check" in text
    default = dataclasses.replace(fixed_flavours()["r2.6.0_3.11_cpu"], companion_versions=(("torchvision", "0.21.0"),))
    assert "do not load" not in format_constraints(default, "")


def test_companions_change_the_constraints_label_and_id() -> None:
    flavour = dataclasses.replace(fixed_flavours()[TAG], id="")
    lock = lock_text(flavour)
    ids = set()
    for versions, installed in (((), ()), (COMPANION_VERSIONS, ()), ((("torchvision", "0.24.1"),), ()),
                                (COMPANION_VERSIONS, ("torchvision",))):
        changed = dataclasses.replace(flavour, companion_versions=versions, companions=installed)
        ids.add(content_id(changed, render.render_flavour(changed, lock), lock, "smoke", "scripts"))
    assert len(ids) == 4  # installing one changes the id with the same lock text (requirements, env, labels)


def test_render_writes_constraints_and_the_image_names_them() -> None:
    flavour = fixed_flavours()[TAG]
    files = render.render_flavour(flavour, lock_text(flavour))
    constraints, dockerfile = files[CONSTRAINTS_NAME], files["Dockerfile"]
    assert f'PIP_CONSTRAINT="{IMAGE_CONSTRAINTS}"' in dockerfile
    assert f'UV_CONSTRAINT="{IMAGE_CONSTRAINTS}"' in dockerfile
    assert f'{CONSTRAINTS_LABEL}="{IMAGE_CONSTRAINTS}"' in dockerfile
    assert f'{CONSTRAINTS_SHA256_LABEL}="{constraints_digest(constraints)}"' in dockerfile
    assert flavour.env["PIP_CONSTRAINT"] == IMAGE_CONSTRAINTS  # what the image check of the env compares


def test_the_derived_layer_comes_after_the_venv_layers_and_before_the_labels() -> None:
    flavour = fixed_flavours()[TAG]
    runtime = render.render_flavour(flavour, lock_text(flavour))["Dockerfile"].split("FROM base AS runtime")[1]
    copies = [line for line in runtime.splitlines() if line.startswith("COPY --from=wheels")]
    assert copies[-1] == "COPY --from=wheels /layers/derived/ /"
    assert copies[:-1] == [f"COPY --from=wheels /layers/{name}/ /"
                           for name in [*render.template_context(flavour)["layers"], "smoke"]]
    assert runtime.index("/layers/derived/") < runtime.index("LABEL ")


def test_a_changed_lock_changes_constraints_label_and_id() -> None:
    flavour = dataclasses.replace(fixed_flavours()[TAG], id="")
    ids, labels = set(), set()
    for extra in ({}, {"numpy": "2.4.7"}):
        lock = lock_text(flavour, extra)
        files = render.render_flavour(flavour, lock)
        labels.add(files[CONSTRAINTS_NAME])
        ids.add(content_id(flavour, files, lock, "smoke", "scripts"))
    assert len(labels) == 2 and len(ids) == 2


def test_committed_constraints_hold_the_committed_lock() -> None:
    checked = 0
    for lock in sorted((ROOT / "Dockerfiles").glob("*/requirements.lock")):
        constraints = (lock.parent / CONSTRAINTS_NAME).read_text()
        pins = {line for line in constraints.splitlines() if not line.startswith("#")}
        locked = {f"{entry.name}=={entry.version}" for entry in parse_lock(lock.read_text()).entries}
        assert locked <= pins and all(pin.split("==")[0] in COMPANIONS for pin in pins - locked), lock
        checked += 1
    assert checked >= 20


# --- the check tool -------------------------------------------------------------------------------------------

def test_the_tool_holds_the_abi_zipapp_members_and_the_imagecheck_package() -> None:
    members = plan_module.check_tool_sources()
    assert set(standalone.sources()) <= set(members), "the tool lacks a module the abi zipapp needs"
    assert {"xla_images/imagecheck/check.py", "xla_images/imagecheck/cli.py"} <= set(members)
    with zipfile.ZipFile(io.BytesIO(check_tool_bytes())) as archive:  # zipfile skips the shebang prefix
        assert set(archive.namelist()) == {"__main__.py", *members}


def test_the_tool_is_executable_and_deterministic(tmp_path: Path) -> None:
    tool = write_check_tool(tmp_path / "xla-images-check")
    assert tool.stat().st_mode & 0o777 == 0o755
    assert tool.read_bytes().startswith(f"#!{VENV}/bin/python -I\n".encode()) and SHEBANG.startswith("#!")
    assert tool.read_bytes() == check_tool_bytes()


def test_the_tool_sources_are_in_the_flavour_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = plan_module.build_scripts_digest()
    changed = dict(plan_module.check_tool_sources())
    extra = tmp_path / "cli.py"
    extra.write_text("# another check\n")
    changed["xla_images/imagecheck/cli.py"] = extra
    monkeypatch.setattr(plan_module, "check_tool_sources", lambda: changed)
    assert plan_module.build_scripts_digest() != before


# --- facts and exit codes on small venvs ----------------------------------------------------------------------

def fake_venv(root: Path, versions: dict[str, str]) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name, version in versions.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody: x\n")
    return root


def run_tool(tool: Path, venv: Path, constraints: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(tool), "--venv", str(venv), "--constraints", str(constraints),
                           "--no-pip-check", *extra], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_check_tool(tmp_path_factory.mktemp("tool") / "xla-images-check")


@pytest.fixture()
def constraints(tmp_path: Path) -> Path:
    path = tmp_path / CONSTRAINTS_NAME
    path.write_text(format_constraints(fixed_flavours()[TAG], lock_text(fixed_flavours()[TAG])))
    return path


def test_read_pins_gives_the_tag_and_canonical_names(constraints: Path) -> None:
    tag, pins = read_pins(constraints)
    assert tag == TAG and pins["torch-xla"] == "2.9.0" and pins["libtpu"] == "0.0.21"


def test_changed_and_missing_flavour_packages_exit_1(tool: Path, constraints: Path, tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", {"torch": "2.10.0", "torch_xla": "2.9.0"})
    result = run_tool(tool, venv, constraints, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert [problem["message"] for problem in report["problems"]] == [
        "torch changed 2.9.0 -> 2.10.0", "libtpu 0.0.21 is no longer installed"]
    assert report["packages"]["torch-xla"] == {"pinned": "2.9.0", "installed": "2.9.0"}


def test_the_flavour_packages_as_pinned_exit_0(tool: Path, constraints: Path, tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", {"torch": "2.9.0", "torch_xla": "2.9.0", "libtpu": "0.0.21"})
    # A GNU ld script named like a library is the linker's, not a module: not an error.
    (venv / "lib" / "python3.11" / "site-packages" / "libfoo.so").write_text("/* GNU ld script */\nINPUT(x)\n")
    result = run_tool(tool, venv, constraints)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"xla-images-check: {TAG} in {venv}: torch 2.9.0, torch-xla 2.9.0")


@pytest.mark.parametrize("broken", ["no-venv", "no-constraints", "constraints-without-torch", "binary-constraints",
                                    "two-sites", "so-not-elf"])
def test_bad_input_is_one_line_exit_2(tool: Path, constraints: Path, tmp_path: Path, broken: str) -> None:
    venv = fake_venv(tmp_path / "venv", {"torch": "2.9.0"})
    if broken == "no-venv":
        venv = tmp_path / "absent"
    elif broken == "no-constraints":
        constraints = tmp_path / "absent.txt"
    elif broken == "constraints-without-torch":
        constraints.write_text("numpy==2.4.6\n")
    elif broken == "binary-constraints":
        constraints.write_bytes(b"\xff\xfe\x00torch")
    elif broken == "two-sites":
        (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    else:
        (venv / "lib" / "python3.11" / "site-packages" / "ext.cpython-311-x86_64-linux-gnu.so").write_text("text")
    result = run_tool(tool, venv, constraints)
    assert result.returncode == 2 and not result.stdout, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("xla-images-check: error [check-") and "Traceback" not in result.stderr


def test_the_paths_the_tool_assumes_are_the_images() -> None:
    """imagecheck is standalone (it cannot import names): its defaults must be the paths the image has."""
    assert imagecheck.CONSTRAINTS == IMAGE_CONSTRAINTS and imagecheck.VENV == VENV
    assert layers.PURE_DIR.startswith(imagecheck.IMAGE_TREE + "/")  # the ABI walk follows site's links there
    assert imagecheck.COMPANION_PACKAGES == COMPANIONS


def test_a_companion_of_another_torch_is_named_and_one_not_installed_is_fine(tool: Path, tmp_path: Path) -> None:
    flavour = dataclasses.replace(fixed_flavours()[TAG], companion_versions=COMPANION_VERSIONS)
    constraints = tmp_path / CONSTRAINTS_NAME
    constraints.write_text(format_constraints(flavour, lock_text(flavour)))
    pinned = {"torch": "2.9.0", "torch_xla": "2.9.0", "libtpu": "0.0.21"}
    venv = fake_venv(tmp_path / "venv", {**pinned, "torchaudio": "2.9.0"})
    assert run_tool(tool, venv, constraints).returncode == 0  # torchaudio as pinned, no torchvision at all
    other = fake_venv(tmp_path / "other", {**pinned, "torchvision": "0.29.2"})
    result = run_tool(tool, other, constraints, "--json")
    assert result.returncode == 1, result.stderr
    assert [problem["message"] for problem in json.loads(result.stdout)["problems"]] == [
        "torchvision is 0.29.2, not 0.24.0, the one built for torch 2.9.0"]


def test_a_metadata_that_is_a_fifo_is_passed_over_not_waited_on(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", {"torch": "2.9.0", "numpy": "2.4.6"})
    site = venv / "lib" / "python3.11" / "site-packages"
    metadata = next(site.glob("numpy*.dist-info")) / "METADATA"
    metadata.unlink()
    os.mkfifo(metadata)  # opened for reading, it would wait for a writer forever
    assert imagecheck.installed_versions(site) == {"torch": "2.9.0"}


@pytest.mark.parametrize("found, shown", [
    ({"libraries_not_found": ("libcudart.so.11.0 (needed by ext.so; searched /opt/venv/lib)",)}, "libcudart.so.11.0"),
    ({"layout_evidence": "compiled with -D_GLIBCXX_USE_CXX11_ABI=0"}, "-D_GLIBCXX_USE_CXX11_ABI=0"),
    ({"pybind11_evidence": "its pybind11 internals (v4) are not torch's (v5)"}, "pybind11 internals"),
])
def test_a_problem_names_the_evidence_the_abi_check_found(found: dict, shown: str) -> None:
    extension = abi.ExtensionCheck(path="ext.so", abi="cxx11", verdict="cannot load", torch_symbols=1, **found)
    report = abi.CheckReport(path="site", verdict="cannot load", summary="", torch_abi="cxx11", torch_libraries=(),
                             extensions=(extension,))
    (problem,) = imagecheck.abi_problems(report, None)
    assert shown in problem.message and "ext.so" in problem.message
