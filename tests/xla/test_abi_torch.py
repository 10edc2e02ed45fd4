"""xla_images.abi against real torch / torch_xla binaries, and the imports that prove its predictions.

Runs under whatever python runs pytest: torch is located with importlib.util.find_spec('torch'), e.g.
`/tmp/xi/venv29/bin/python -m pytest tests/xla` (torch 2.9.0 + torch_xla 2.9.0). Wheels downloaded from the
package index are cached in $XLA_IMAGES_TEST_WHEELS (default ~/.cache/xla-images/test-wheels).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mixes import mirror
from xla_images import abi


REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "abi"
WHEELS = Path(os.environ.get("XLA_IMAGES_TEST_WHEELS", Path.home() / ".cache" / "xla-images" / "test-wheels"))
PRE_CXX11_TORCH_XLA = "2.6.0"  # the last torch_xla published with the pre-C++11 ABI
CXX11_TORCH_XLA = "2.9.0"


def _torch_site() -> Path | None:
    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent.parent if spec and spec.origin else None


TORCH_SITE = _torch_site()
pytestmark = pytest.mark.skipif(TORCH_SITE is None, reason=f"torch is not importable by {sys.executable}")


def run_python(code: str, *, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def run_abi(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xla_images.abi", *arguments], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)


@pytest.fixture(scope="module")
def torch_cxx11() -> bool:
    completed = run_python("import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip() == "1"


def site_view(directory: Path, replacements: dict[str, Path] | None = None, *, drop: tuple[str, ...] = ()) -> Path:
    """A site-packages made of hard-linked copies of the torch one (abi_mixes.mirror), minus entries starting with
    `drop`, plus others."""
    directory.mkdir()
    for entry in TORCH_SITE.iterdir():
        if not entry.name.startswith(drop):
            mirror(entry, directory / entry.name)
    for name, target in (replacements or {}).items():
        mirror(target, directory / name)
    return directory


# --- a tiny C++ extension built here against the installed torch ---------------------------------------------


def build_extension(output: Path, *, cxx11: bool) -> Path:
    torch = TORCH_SITE / "torch"
    command = ["g++", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11)}",
               f"-I{torch / 'include'}", f"-I{torch / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
               str(FIXTURES / "torch_extension.cpp"), f"-L{torch / 'lib'}", "-lc10",
               f"-Wl,-rpath,{torch / 'lib'}", "-o", str(output)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    return output


def load(extension: Path) -> subprocess.CompletedProcess:
    return run_python("import ctypes, os, sys, torch\n"
                      f"print(ctypes.CDLL({str(extension)!r}, mode=os.RTLD_NOW).torch_extension_entry())")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_extension_with_torchs_abi_is_classified_compatible_and_loads(tmp_path: Path, torch_cxx11: bool) -> None:
    view = site_view(tmp_path / "site", drop=("_XLAC", "torch_xla", "functorch"))
    extension = build_extension(view / "_probe.cpython-311-x86_64-linux-gnu.so", cxx11=torch_cxx11)
    assert abi.classify_shared_object(extension).abi == (abi.CXX11 if torch_cxx11 else abi.PRE_CXX11)
    report = abi.check_site_packages(view)
    assert report.torch_abi == (abi.CXX11 if torch_cxx11 else abi.PRE_CXX11)
    (probe,) = [item for item in report.extensions if item.path.startswith("_probe")]
    assert probe.verdict == abi.COMPATIBLE and probe.torch_symbols >= 2
    loaded = load(extension)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "42"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_extension_with_the_other_abi_is_flagged_and_fails_to_load(tmp_path: Path, torch_cxx11: bool) -> None:
    view = site_view(tmp_path / "site", drop=("_XLAC", "torch_xla", "functorch"))
    extension = build_extension(view / "_probe.cpython-311-x86_64-linux-gnu.so", cxx11=not torch_cxx11)
    assert abi.classify_shared_object(extension).abi == (abi.PRE_CXX11 if torch_cxx11 else abi.CXX11)
    report = abi.check_site_packages(view)
    assert report.verdict == abi.ABI_MISMATCH
    (probe,) = [item for item in report.extensions if item.path.startswith("_probe")]
    assert {item.problem for item in probe.missing} == {abi.ABI_MISMATCH}
    assert any("c10::Device::Device" in item.demangled for item in probe.missing) or not shutil.which("c++filt")
    loaded = load(extension)
    assert loaded.returncode != 0 and "undefined symbol" in loaded.stderr
    failing = loaded.stderr.split("undefined symbol: ")[1].split()[0]
    assert failing in {item.symbol for item in probe.missing}
    assert run_abi("check", str(view)).returncode == 1


# --- published wheels ------------------------------------------------------------------------------------------


def cached_wheel(version: str) -> Path:
    """torch_xla==version for cp311 manylinux x86_64, downloaded once into WHEELS."""
    pattern = f"torch_xla-{version}-cp311-cp311-manylinux*_x86_64.whl"
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        completed = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
             "--implementation", "cp", "--abi", "cp311", "--platform", "manylinux_2_28_x86_64", "-d", str(WHEELS),
             f"torch_xla=={version}"], capture_output=True, text=True, timeout=1800)
        found = sorted(WHEELS.glob(pattern))
        if not found:
            pytest.skip(f"cannot download torch_xla=={version}: {completed.stderr.strip()[-300:]}")
    return found[0]


@pytest.mark.parametrize(("version", "expected"), [(PRE_CXX11_TORCH_XLA, abi.PRE_CXX11),
                                                   (CXX11_TORCH_XLA, abi.CXX11)])
def test_published_torch_xla_wheel_abi(version: str, expected: str) -> None:
    report = abi.inspect_path(cached_wheel(version))
    assert report.kind == "wheel" and report.abi == expected
    assert report.platform_tag and report.platform_tag.startswith("manylinux")
    xlac = [item for item in report.shared_objects if item.path.startswith("_XLAC.")]
    assert xlac and xlac[0].abi == expected and xlac[0].glibcxx


# --- torch_xla 2.6 beside torch 2.9: predicted and real failure ------------------------------------------------


@pytest.fixture(scope="module")
def torch_xla_pair() -> tuple[str, str]:
    try:
        return importlib.metadata.version("torch"), importlib.metadata.version("torch_xla")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs torch and torch_xla installed side by side")


def test_old_torch_xla_beside_new_torch_is_a_mismatch_and_fails_to_import(
        tmp_path_factory: pytest.TempPathFactory, torch_cxx11: bool, torch_xla_pair: tuple[str, str]) -> None:
    if not torch_cxx11:
        pytest.skip("needs a C++11-ABI torch (>= 2.7) to pair with the pre-C++11 torch_xla 2.6.0")
    target = tmp_path_factory.mktemp("torch_xla_26")
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                                str(cached_wheel(PRE_CXX11_TORCH_XLA))], capture_output=True, text=True, timeout=1800)
    assert installed.returncode == 0, installed.stderr[-2000:]
    replacements = {entry.name: entry for entry in target.iterdir()
                    if entry.name.startswith(("torch_xla", "_XLAC"))}
    view = site_view(tmp_path_factory.mktemp("combined") / "site", replacements, drop=("torch_xla", "_XLAC"))

    report = abi.check_site_packages(view)
    assert report.verdict == abi.ABI_MISMATCH and report.torch_abi == abi.CXX11
    (xlac,) = [item for item in report.extensions if item.path.startswith("_XLAC.")]
    assert xlac.abi == abi.PRE_CXX11
    twins = {item.symbol: item.twin for item in xlac.missing if item.problem == abi.ABI_MISMATCH}
    assert twins.get("_ZN5torch4lazy13MetricFnValueEd") == "_ZN5torch4lazy13MetricFnValueB5cxx11Ed"
    checked = run_abi("check", str(view), "--json")
    assert checked.returncode == 1, checked.stderr

    imported = run_python("import torch_xla", pythonpath=view)
    assert imported.returncode != 0
    assert "undefined symbol" in imported.stderr
    failing = imported.stderr.split("undefined symbol: ")[1].split()[0]
    assert failing in {item.symbol for item in xlac.missing}


def test_installed_pair_is_compatible_and_imports(torch_xla_pair: tuple[str, str]) -> None:
    torch_version, torch_xla_version = torch_xla_pair
    if torch_version.split(".")[:2] != torch_xla_version.split(".")[:2]:
        pytest.skip(f"torch {torch_version} and torch_xla {torch_xla_version} are not a release pair")
    report = abi.check_site_packages(TORCH_SITE)
    assert report.verdict == abi.COMPATIBLE, report.summary
    assert any(item.path.startswith("_XLAC.") and item.torch_symbols > 100 for item in report.extensions)
    assert run_abi("check", str(TORCH_SITE)).returncode == 0
    imported = run_python("import torch_xla; print(torch_xla.__version__)")
    assert imported.returncode == 0, imported.stderr[-2000:]


def test_a_site_named_by_a_relative_path_is_judged_as_by_its_absolute_one(torch_xla_pair: tuple[str, str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """$ORIGIN expands to the library's own directory: from a relative site every RUNPATH of _XLAC was relative,
    which the loader (as ld.so) does not search, and the pair that imports was called "missing library"."""
    absolute = abi.check_site_packages(TORCH_SITE)
    monkeypatch.chdir(TORCH_SITE.parent)
    relative = abi.check_site_packages(Path(TORCH_SITE.name))
    assert (relative.verdict, [item.verdict for item in relative.extensions]) == (
        absolute.verdict, [item.verdict for item in absolute.extensions]), relative.summary
