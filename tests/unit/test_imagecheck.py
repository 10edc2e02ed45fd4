"""The derived-image layer: constraints.txt rendered from the lock (PIP_CONSTRAINT, labels, id) and the
`xla-images-check` zipapp (its members, its facts, its exit codes on small fake venvs; the real venv is
tests/xla/test_image_check.py's)."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from xla_images import abi, layers
from xla_images.abi import standalone
from xla_images.generate import plan as plan_module
from xla_images.generate import render
from xla_images.imagecheck import explain, read_pins, sitedata
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
    assert tool.read_bytes().startswith(f"#!{VENV}/bin/python -IS\n".encode()) and SHEBANG.startswith("#!")
    assert tool.read_bytes() == check_tool_bytes()


def test_the_tool_sources_are_in_the_flavour_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = plan_module.build_scripts_digest()
    changed = dict(plan_module.check_tool_sources())
    extra = tmp_path / "cli.py"
    extra.write_text("# another check\n")
    changed["xla_images/imagecheck/cli.py"] = extra
    monkeypatch.setattr(plan_module, "check_tool_sources", lambda: changed)
    assert plan_module.build_scripts_digest() != before


# --- crafted venvs: real `python -m venv` venvs of /usr/bin/python3, fake distributions, a torch stand-in ----------

SYSTEM_PYTHON = "/usr/bin/python3"
HOST_PIP = next(Path(sys.prefix).glob("lib/python3.*/site-packages/pip"))
PINNED = {"torch": "2.9.0", "torch_xla": "2.9.0", "libtpu": "0.0.21"}
# The stand-in for torch: imports like torch does (fails like it without torch/lib) and tells its ABI the same way.
TORCH_INIT = """import os
if not os.path.isdir(os.path.join(os.path.dirname(__file__), "lib")):
    raise OSError("libtorch_global_deps.so: cannot open shared object file: No such file or directory")
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
"""


@pytest.fixture()
def constraints(tmp_path: Path) -> Path:
    path = tmp_path / CONSTRAINTS_NAME
    path.write_text(format_constraints(fixed_flavours()[TAG], lock_text(fixed_flavours()[TAG])))
    return path


needs_system_python = pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no /usr/bin/python3")


def site_of(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3.*/site-packages")
    return site


def add_dist(site: Path, name: str, version: str, *, requires: tuple[str, ...] = (), egg: bool = False,
             keys: tuple[str, str] = ("Name", "Version"), record: tuple[str, ...] = ()) -> Path:
    info = site / (f"{name}-{version}.egg-info" if egg else f"{name}-{version}.dist-info")
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"{keys[0]}: {name}", f"{keys[1]}: {version}",
             *(f"Requires-Dist: {requirement}" for requirement in requires)]
    (info / ("PKG-INFO" if egg else "METADATA")).write_text("\n".join(lines) + "\n\nThe description.\n")
    if record:
        (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))
    return info


def add_package(site: Path, name: str, init: str, *, shared: bytes = b"not ELF: a stand-in") -> None:
    """A package holding a shared object (so the check imports it) whose __init__ does what the test needs."""
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(init)
    (site / name / "_C.so").write_bytes(shared)


def crafted_venv(root: Path, versions: dict[str, str] | None = None, *, torch: bool = True) -> Path:
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    site = site_of(root)
    (site / "pip").symlink_to(HOST_PIP)  # pip's packaging evaluates the requirements
    for name, version in (versions if versions is not None else PINNED).items():
        add_dist(site, name, version, record=(f"{name}/__init__.py",) if name == "torch" else ())
    if torch:
        add_package(site, "torch", TORCH_INIT)
        (site / "torch" / "lib").mkdir()
    return root


def check(venv: Path, constraints: Path, *extra: str, env: dict[str, str] | None = None,
          tool_path: Path | None = None) -> subprocess.CompletedProcess:
    """The tool as the image runs it: its shebang's flags, on the venv's own python."""
    tool_path = tool_path or write_check_tool(venv / "xla-images-check", f"#!{venv}/bin/python -IS\n")
    return subprocess.run([str(tool_path), "--venv", str(venv), "--constraints", str(constraints), *extra],
                          capture_output=True, text=True, timeout=240, env=env)


def problems_of(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return [problem["message"] for problem in json.loads(result.stdout)["problems"]]


def assert_exit_2(result: subprocess.CompletedProcess, rule: str, *words: str) -> None:
    assert result.returncode == 2 and not result.stdout, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"xla-images-check: error [{rule}]") and "Traceback" not in result.stderr, line
    assert all(word in line for word in words), line


def test_read_pins_gives_the_tag_and_canonical_names(constraints: Path) -> None:
    tag, pins = read_pins(constraints)
    assert tag == TAG and pins["torch-xla"] == "2.9.0" and pins["libtpu"] == "0.0.21"


@pytest.mark.parametrize("one, other, equal", [
    ("2.9", "2.9.0", True), ("1.0RC1", "1.0rc1", True), ("v1.0", "1.0.0", True), ("2.9.0+cpu", "2.9.0", False),
    ("1.0.post1", "1.0-1", True), ("2.10.0", "2.9.0", False), ("1!1.0", "1.0", False), ("weird", "weird", True)])
def test_versions_are_compared_as_pep_440_says(one: str, other: str, equal: bool) -> None:
    assert sitedata.same_version(one, other) is equal


@needs_system_python
def test_the_image_as_pinned_exits_0_and_imports_torch_first(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    # A GNU ld script named like a library is the linker's, not a module: not an error, not imported.
    (site_of(venv) / "libfoo.so").write_text("/* GNU ld script */\nINPUT(x)\n")
    result = check(venv, constraints, "--abi", "cxx11", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["imports"]["imported"] == ["torch"] and report["imports"]["torch_abi"] == "cxx11"
    assert report["imports"]["children"] == 1 and "not called" in report["imports"]["exercised"]
    text = check(venv, constraints).stdout
    assert text.startswith(f"xla-images-check: {TAG} in {venv}: torch 2.9.0, torch-xla 2.9.0, libtpu 0.0.21")
    assert "\nok: " in text


@needs_system_python
@pytest.mark.parametrize("case", ["short-version", "lower-case-keys", "torch-egg-info", "arbitrary-equality"])
def test_what_pip_calls_the_pinned_version_holds(constraints: Path, tmp_path: Path, case: str) -> None:
    venv = crafted_venv(tmp_path / "venv", {"torch_xla": "2.9.0", "libtpu": "0.0.21"})
    site = site_of(venv)
    if case == "short-version":
        add_dist(site, "torch", "2.9")  # PEP 440: 2.9 == 2.9.0
    elif case == "lower-case-keys":
        add_dist(site, "torch", "2.9.0", keys=("name", "version"))
    elif case == "torch-egg-info":
        add_dist(site, "torch", "2.9.0", egg=True)
    else:
        add_dist(site, "torch", "2.9.0")
        constraints.write_text(constraints.read_text().replace("torch==2.9.0", "torch===2.9.0"))
    result = check(venv, constraints, "--json")
    assert result.returncode == 0 and problems_of(result) == [], result.stdout + result.stderr


@needs_system_python
def test_changed_and_missing_flavour_packages_exit_1(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv", {"torch": "2.10.0", "torch_xla": "2.9.0"})
    result = check(venv, constraints, "--json")
    assert result.returncode == 1, result.stderr
    assert problems_of(result) == ["torch changed 2.9.0 -> 2.10.0", "libtpu 0.0.21 is no longer installed"]
    assert json.loads(result.stdout)["packages"]["torch-xla"] == {"pinned": "2.9.0", "installed": "2.9.0"}


@needs_system_python
def test_two_installs_of_one_distribution_are_a_problem(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    add_dist(site_of(venv), "torch", "2.10.0")
    (problem,) = problems_of(result := check(venv, constraints, "--json"))
    assert result.returncode == 1 and problem.startswith("torch is installed 2 times: 2.10.0 (torch-2.10.0.dist-info), "
                                                          "2.9.0 (torch-2.9.0.dist-info)")


@needs_system_python
def test_a_companion_installed_as_egg_info_is_read(tmp_path: Path) -> None:
    flavour = dataclasses.replace(fixed_flavours()[TAG], companion_versions=COMPANION_VERSIONS)
    constraints = tmp_path / CONSTRAINTS_NAME
    constraints.write_text(format_constraints(flavour, lock_text(flavour)))
    venv = crafted_venv(tmp_path / "venv")
    add_dist(site_of(venv), "torchaudio", "2.9.0")  # as pinned; torchvision not installed at all: fine
    assert check(venv, constraints).returncode == 0
    add_dist(site_of(venv), "torchvision", "0.29.2", egg=True)
    result = check(venv, constraints, "--json")
    assert result.returncode == 1 and problems_of(result) == [
        "torchvision is 0.29.2, not 0.24.0, the one built for torch 2.9.0"]


@needs_system_python
def test_requirements_are_pip_checks_and_an_unparsable_one_is_named(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    site = site_of(venv)
    add_dist(site, "needs-missing", "1.0", requires=("xla-images-no-such-package>=1", 'extra-only; extra == "x"',
                                                     "torch>=2.10"))
    add_dist(site, "broken-meta", "1.0", requires=("torch >>> 2",))
    result = check(venv, constraints, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert problems_of(result) == [
        "unsatisfied requirement: broken-meta 1.0 has a requirement pip cannot read: 'torch >>> 2' "
        + problems_of(result)[0].split("'torch >>> 2' ", 1)[1],
        "unsatisfied requirement: needs-missing 1.0 requires xla-images-no-such-package>=1, which is not installed.",
        "unsatisfied requirement: needs-missing 1.0 has requirement torch>=2.10, but you have 2.9.0."]
    assert "unparsable" in problems_of(result)[0]


@needs_system_python
def test_no_site_packages_code_runs_in_the_checker_or_its_requirements_step(constraints: Path,
                                                                             tmp_path: Path) -> None:
    """A .pth runs at every start of a python with site: only the import children may run it."""
    venv = crafted_venv(tmp_path / "venv")
    marker = tmp_path / "ran"
    (site_of(venv) / "zz-marker.pth").write_text(
        f"import sys; open({str(marker)!r}, 'a').write(repr(sys.orig_argv[1:2]) + chr(10))\n")
    result = check(venv, constraints, "--no-import")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists(), marker.read_text()  # neither the checker nor the requirements child ran it
    result = check(venv, constraints, "--json")
    children = json.loads(result.stdout)["imports"]["children"]
    lines = marker.read_text().splitlines()
    # The import child only (Debian's python runs a venv's .pth once per site directory name: lib and lib64).
    assert children == 1 and lines and set(lines) == {"['-c']"}, lines


@needs_system_python
def test_a_pth_that_ends_python_fails_the_check_instead_of_ending_it(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    (site_of(venv) / "evil.pth").write_text("import os; os._exit(0)\n")
    add_dist(site_of(venv), "needs-missing", "1.0", requires=("xla-images-no-such-package",))
    result = check(venv, constraints, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    # The requirements are still read (the .pth made `pip check` exit 0 with no output before), then the imports.
    requirement, problem = problems_of(result)
    assert requirement == ("unsatisfied requirement: needs-missing 1.0 requires xla-images-no-such-package, "
                           "which is not installed.")
    assert "before it imported anything" in problem and "exit 0" in problem
    assert "evil.pth" in json.loads(result.stdout)["information"]["pth_files"]


@needs_system_python
def test_torch_without_its_libraries_does_not_import(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    shutil.rmtree(site_of(venv) / "torch" / "lib")
    result = check(venv, constraints, "--json")
    assert result.returncode == 1
    (problem,) = problems_of(result)
    assert problem.startswith("`import torch` fails: OSError") and "libtorch_global_deps.so" in problem


@needs_system_python
def test_each_failure_is_attributed_alone_and_the_rest_still_imports(constraints: Path, tmp_path: Path) -> None:
    """A crash, an undefined symbol, a hang and a good package in one venv: one child for all, then one per
    failure (torch first each time); the good one is judged although a crash came before it."""
    venv = crafted_venv(tmp_path / "venv")
    site = site_of(venv)
    symbol = "_ZN5torch4lazy13MetricFnValueB5cxx11Ed"
    add_package(site, "a_crash", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    add_package(site, "b_symbol", f"raise ImportError('{site}/b_symbol/_C.so: undefined symbol: {symbol}')\n")
    add_package(site, "c_hang", "import time\ntime.sleep(600)\n")
    add_package(site, "d_good", "VALUE = 1\n")
    result = check(venv, constraints, "--json", "--import-timeout", "20")
    assert result.returncode == 1, result.stdout + result.stderr
    crash, undefined, hang = problems_of(result)
    assert crash.startswith("`import a_crash` dies: crashed (SIGSEGV)"), crash
    assert undefined.startswith("`import b_symbol` fails: ImportError") and f"undefined symbol {symbol} (C++11 ABI" in \
        undefined and "wanted by " + str(site / "b_symbol" / "_C.so") in undefined, undefined
    assert hang.startswith("`import c_hang` dies: timed out"), hang
    report = json.loads(result.stdout)
    assert report["imports"]["imported"] == ["d_good", "torch"]
    # The batch (to the crash), the batch after it (to the hang), the one after that (d_good), the crash alone,
    # the symbol alone: five (the hang is not waited for twice).
    assert report["imports"]["children"] == 5


@needs_system_python
def test_a_shared_object_nothing_imports_is_information(constraints: Path, tmp_path: Path) -> None:
    venv = crafted_venv(tmp_path / "venv")
    site = site_of(venv)
    compiled = subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(tmp_path / "real.so")],
                              input="int unused(void) { return 0; }\n", capture_output=True, text=True, timeout=120)
    if compiled.returncode != 0:
        pytest.skip(f"no C compiler: {compiled.stderr[-200:]}")
    (site / "prototype").mkdir()
    shutil.copy(tmp_path / "real.so", site / "prototype" / "_cuda_cp310.so")  # no __init__, nobody imports it
    (site / "loose.cpython-310-x86_64-linux-gnu.so").write_bytes(b"not ELF")
    result = check(venv, constraints, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    information = json.loads(result.stdout)["information"]
    assert "prototype/_cuda_cp310.so" in information["not_loaded"]
    assert "loose.cpython-310-x86_64-linux-gnu.so" in information["not_elf"]


@needs_system_python
def test_links_are_followed_inside_the_tree_once_and_never_out(constraints: Path, tmp_path: Path) -> None:
    """A link cycle inside site-packages is walked once; a link out of it (to /usr/lib) is not walked at all."""
    venv = crafted_venv(tmp_path / "venv")
    site = site_of(venv)
    (site / "cycle").mkdir()
    (site / "cycle" / "back").symlink_to(site)
    (site / "outside").symlink_to("/usr/lib")
    result = check(venv, constraints, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    information = json.loads(result.stdout)["information"]
    assert information["not_elf"] == ["torch/_C.so"] and information["not_loaded"] == []


@needs_system_python
@pytest.mark.parametrize("broken", ["no-venv", "no-constraints", "constraints-without-torch", "binary-constraints",
                                    "two-sites", "torch-pinned-twice", "dangling-python", "metadata-is-a-fifo",
                                    "metadata-is-a-directory", "huge-metadata", "site-is-a-link-out", "abi-banana"])
def test_what_cannot_be_read_is_one_line_exit_2(constraints: Path, tmp_path: Path, broken: str) -> None:
    venv = crafted_venv(tmp_path / "venv")
    site = site_of(venv)
    tool_path = write_check_tool(tmp_path / "xla-images-check", f"#!{venv}/bin/python -IS\n")
    extra: list[str] = []
    rule, words = "check-facts", ()
    if broken == "no-venv":
        shutil.rmtree(venv / "lib")
        rule, words = "check-venv", ("0 lib/python3.*/site-packages",)
    elif broken == "no-constraints":
        constraints = tmp_path / "absent.txt"
    elif broken == "constraints-without-torch":
        constraints.write_text("numpy==2.4.6\n")
    elif broken == "binary-constraints":
        constraints.write_bytes(b"\xff\xfe\x00torch")
    elif broken == "two-sites":
        (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
        rule = "check-venv"
    elif broken == "torch-pinned-twice":
        constraints.write_text(constraints.read_text() + "torch==2.10.0\n")
        words = ("pins torch twice (2.9.0 and 2.10.0)",)
    elif broken == "dangling-python":
        (venv / "bin" / "python3").unlink()
        (venv / "bin" / "python3").symlink_to(tmp_path / "gone")
        tool_path.write_bytes(tool_path.read_bytes().replace(f"{venv}/bin/python".encode(),
                                                             SYSTEM_PYTHON.encode(), 1))
        rule, words = "check-venv", ("dangling link",)
    elif broken.startswith("metadata-is-a-") or broken == "huge-metadata":
        metadata = site / "torch-2.9.0.dist-info" / "METADATA"
        metadata.unlink()
        if broken == "metadata-is-a-fifo":
            os.mkfifo(metadata)  # opened for reading, it would wait for a writer forever
        elif broken == "metadata-is-a-directory":
            metadata.mkdir()
        else:
            with open(metadata, "wb") as handle:  # 1.5 GB without a newline, sparse: nothing to hold whole
                handle.truncate(1536 << 20)
        rule, words = "check-metadata", (str(metadata),)
    elif broken == "site-is-a-link-out":
        shutil.rmtree(site)
        site.symlink_to("/")
        rule, words = "check-venv", ("leads out of the venv",)
    else:
        rule, words = "check-usage", ("banana",)
    environment = {**os.environ, "XLA_IMAGES_ABI": "banana"} if broken == "abi-banana" else None
    result = check(venv, constraints, *extra, tool_path=tool_path, env=environment)
    assert_exit_2(result, rule, *words)


@needs_system_python
def test_metadata_unreadable_by_the_user_is_exit_2(constraints: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """As a user who cannot read one METADATA (root reads everything: the check runs as nobody)."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to become another user")
    root = Path(tempfile.mkdtemp(prefix="imagecheck-", dir="/tmp"))
    try:
        root.chmod(0o755)
        venv = crafted_venv(root / "venv")
        shutil.copy(constraints, root / "constraints.txt")
        tool_path = write_check_tool(root / "xla-images-check", f"#!{venv}/bin/python -IS\n")
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True, timeout=60)
        metadata = site_of(venv) / "torch-2.9.0.dist-info" / "METADATA"
        metadata.chmod(0o600)
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(tool_path),
                                 "--venv", str(venv), "--constraints", str(root / "constraints.txt")],
                                capture_output=True, text=True, timeout=120)
        assert_exit_2(result, "check-metadata", str(metadata), "Permission denied")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_paths_the_tool_assumes_are_the_images() -> None:
    """imagecheck is standalone (it cannot import names): its defaults must be the paths the image has."""
    assert imagecheck.CONSTRAINTS == IMAGE_CONSTRAINTS and imagecheck.VENV == VENV
    assert layers.PURE_DIR.startswith(imagecheck.IMAGE_TREE + "/")  # the walks follow site's links there
    assert imagecheck.COMPANION_PACKAGES == COMPANIONS


@pytest.mark.parametrize("found, shown", [
    ({"libraries_not_found": ("libcudart.so.11.0 (needed by ext.so; searched /opt/venv/lib)",)}, "libcudart.so.11.0"),
    ({"layout_evidence": "compiled with -D_GLIBCXX_USE_CXX11_ABI=0"}, "-D_GLIBCXX_USE_CXX11_ABI=0"),
    ({"pybind11_evidence": "its pybind11 internals (v4) are not torch's (v5)"}, "pybind11 internals"),
])
def test_an_explanation_names_the_evidence_the_abi_reader_found(found: dict, shown: str) -> None:
    extension = abi.ExtensionCheck(path="ext.so", abi="cxx11", verdict="cannot load", torch_symbols=1, **found)
    assert shown in explain._cause(extension, "cxx11")
