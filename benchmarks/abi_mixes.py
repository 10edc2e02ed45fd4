#!/usr/bin/env python3
"""`abi check` verdicts against what `import` really does, on real PyPI mixes of torch, torch_xla and extensions.

    python benchmarks/abi_mixes.py [--mix NAME ...] [--json]

For each mix a site-packages is assembled from the torch site-packages of the python running this script (the
host venv: torch 2.9.0 + torch_xla 2.9.0 and torch's nvidia-* CUDA libraries) with some distributions replaced
by other releases, installed with `pip install --no-deps --target` from wheels downloaded once. Then:

* prediction: `abi.check_site_packages(view)` (verdict, and the symbols it says are missing);
* reality: a fresh python with the view first on sys.path imports the packages and calls into each extension
  (an XLA computation, `torchvision.ops.nms`, a torchaudio C++ operator), with PJRT_DEVICE=CPU.

It prints a table (mix, prediction, real outcome, agree?); tests/xla/test_abi_mixes.py runs the same mixes
through `run_mix`. Wheels and the installed overlays are cached in $XLA_IMAGES_TEST_WHEELS (default
~/.cache/xla-images/test-wheels); the torch wheels are ~800-900 MB each.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xla_images import abi  # noqa: E402

WHEELS = Path(os.environ.get("XLA_IMAGES_TEST_WHEELS", Path.home() / ".cache" / "xla-images" / "test-wheels"))
# torch 2.6.0 is tagged manylinux1, nvidia-cusparselt-cu12 0.6.3 manylinux2014
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
RUN_TIMEOUT = 600

HARNESS = "xla_images_harness"  # the custom operator extension's directory in the view, and its probe
STREAMS = "xla_images_streams"  # the extension using std::ostringstream, THPDtypeType and c10d:: (class 2)
GROUND_TRUTH = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "abi" / "ground_truth"
# What each compiled extension is built from: (source, defines, libraries), its C++ ABI follows its torch's.
BUILT = {HARNESS: ("operators.cpp", (), ("c10", "torch", "torch_cpu")),
         STREAMS: ("thp_c10d.cpp", ("STREAM",), ("c10", "torch_cpu", "torch_python"))}
# Issue 34's classes, compiled against the host's torch 2.9.0: (source, defines, libraries, helper layout (see
# build_helpers), _GLIBCXX_USE_CXX11_ABI or None for torch's, a python module?, the pybind11 release whose headers
# it is built with or None for torch's bundled one).
OTHER_PYBIND11 = "2.13.6"  # internals v4, where torch 2.9's bundled pybind11 3.0.1 has v11
LOADER_KINDS = {
    "xla_images_helper_absent": ("helpers.cpp", (), ("c10",), "absent", None, False, None),
    "xla_images_helper_beside": ("helpers.cpp", (), ("c10",), "beside", None, False, None),
    "xla_images_helper_runpath": ("helpers.cpp", (), ("c10",), "runpath", None, False, None),
    "xla_images_helper_own_runpath": ("helpers.cpp", (), ("c10",), "helper-runpath", None, False, None),
    "xla_images_helper_rpath": ("helpers.cpp", (), ("c10",), "rpath", None, False, None),
    "xla_images_newer_c_api": ("python_api.cpp", ("NEWER_API",), ("c10",), None, None, True, None),
    "xla_images_c_api": ("python_api.cpp", (), ("c10",), None, None, True, None),
    # issue 34's false alarm: always C++11, so against torch 2.6's headers it is the C++11 build of 2.6 (headers do
    # not depend on the flag; torch 2.6's PyPI wheel is pre-C++11, its include tree is the same)
    "xla_images_classes": ("custom_class.cpp", (), ("c10", "torch", "torch_cpu"), None, 1, False, None),
    "xla_images_layout_other": ("layout.cpp", (), ("c10", "torch_cpu"), None, 0, False, None),
    "xla_images_layout_same": ("layout.cpp", (), ("c10", "torch_cpu"), None, 1, False, None),
    "xla_images_pybind11_other": ("pybind_types.cpp", ("EXCHANGE",), ("c10",), None, None, True, OTHER_PYBIND11),
    "xla_images_pybind11_other_own_types": ("pybind_types.cpp", (), ("c10",), None, None, True, OTHER_PYBIND11),
    "xla_images_pybind11_torchs": ("pybind_types.cpp", ("EXCHANGE",), ("c10",), None, None, True, None),
}
MODULE = f"_ext.cpython-{sys.version_info[0]}{sys.version_info[1]}-x86_64-linux-gnu.so"

# What each probe prints last when everything it called worked.
PROBE_OK = "PROBE-OK"

# Calls that go through the extension's C++ code, not just `import`: torchvision and torchaudio import even
# when their extension fails to load (they warn, or fall back to python code), so only a call tells.
PROBES: dict[str, str] = {
    "torch_xla": ("import torch, torch_xla\n"
                  "t = torch.ones(3, device=torch_xla.device()) * 2\n"
                  "assert t.sum().item() == 6.0\n"),
    "torchvision": ("import torch, torchvision\n"
                    "boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])\n"
                    "kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)\n"
                    "assert kept.tolist() == [0, 2], kept\n"),
    # torchaudio.functional.lfilter silently uses python code when the extension is missing: call the operator
    # behind it (in torchaudio 2.8 and 2.9) and compare with that python code.
    "torchaudio": ("import torch, torchaudio\n"
                   "import torchaudio.lib._torchaudio  # the extension module that loads libtorchaudio\n"
                   "from torchaudio.functional.filtering import _lfilter_core_generic_loop\n"
                   "windows = torch.rand(1, 1, 16, dtype=torch.float64)\n"
                   "a = torch.tensor([[0.5, 1.0]], dtype=torch.float64)\n"
                   "out = torch.zeros(1, 1, 17, dtype=torch.float64)\n"
                   "expected = out.clone()\n"
                   "torch.ops.torchaudio._lfilter_core_loop(windows.clone(), a, out)\n"
                   "_lfilter_core_generic_loop(windows.clone(), a, expected)\n"
                   "assert torch.allclose(out, expected), (out, expected)\n"),
    **{name: ("import ctypes, os, importlib.util, torch\n"
              f"path = os.path.join(os.path.dirname(importlib.util.find_spec('torch').submodule_search_locations[0]),"
              f" '{name}', '_ext.so')\n"
              "library = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)\n"
              "assert library.harness_entry() == 0\n"
              + ("assert torch.ops.xla_images_harness.twice(torch.ones(2)).tolist() == [2.0, 2.0]\n"
                 if name == HARNESS else "")
              + ("assert torch.classes.xla_images_classes.Counter(40).add(2) == 42\n"
                 if name == "xla_images_classes" else "")) for name in (HARNESS, STREAMS, *LOADER_KINDS)
       if not (name in LOADER_KINDS and LOADER_KINDS[name][5])},
    **{name: ("import os, sys, importlib.util, torch\n"
              f"sys.path.insert(0, os.path.join(os.path.dirname(importlib.util.find_spec('torch')"
              f".submodule_search_locations[0]), '{name}'))\n"
              "import _ext\nassert _ext.harness_entry() == 0\n"
              "assert not hasattr(_ext, 'exchange') or isinstance(_ext.exchange(), torch._C.DispatchKey)\n")
       for name, built in LOADER_KINDS.items() if built[5]},
}


@dataclass(frozen=True)
class Mix:
    """Distributions replacing the host's (name==version) and the packages whose probes decide the outcome."""

    name: str
    replace: tuple[str, ...]
    probes: tuple[str, ...]
    why: str
    ci: bool = False  # in tests/xla's CI subset (small downloads only)
    headers: str | None = None  # compile the extension (the probe: HARNESS or STREAMS) against this torch release



# What a torch release needs beside it that the host's differs in. torch 2.6 pins triton 3.2.0 (the host venv has
# torch 2.9's 3.5): torch_xla 2.6's import reaches triton.
# torch 2.7 finds libcusparseLt.so.0 in cusparselt/lib (nvidia-cusparselt-cu12 0.6.3), where the host's 0.7.1 has
# nvidia/cusparselt/lib: without it torch 2.7 does not import at all.
COMPANIONS = {"2.6.0": "triton==3.2.0", "2.7.0": "nvidia-cusparselt-cu12==0.6.3"}


def _xla(torch: str, xla: str, why: str, ci: bool = False) -> Mix:
    replace = tuple(item for item in (f"torch=={torch}" if torch != "2.9.0" else "",
                                      f"torch_xla=={xla}" if xla != "2.9.0" else "", COMPANIONS.get(torch, ""))
                    if item)
    return Mix(f"torch {torch} + torch_xla {xla}", replace, ("torch_xla",), why, ci=ci)


def _extension(torch: str, package: str, version: str, built_for: str, why: str, ci: bool = False) -> Mix:
    replace = tuple(item for item in (f"torch=={torch}" if torch != "2.9.0" else "", f"{package}=={version}") if item)
    return Mix(f"torch {torch} + {package} {version} (for torch {built_for})", replace, (package,), why, ci=ci)


def _operators(torch: str, headers: str, why: str, kind: str = HARNESS) -> Mix:
    """A custom extension (BUILT[kind]: registering an operator, or using std::ostringstream) compiled here against
    torch `headers`' include tree and libraries, imported beside torch `torch`."""
    replace = tuple(item for item in (f"torch=={torch}" if torch != "2.9.0" else "", COMPANIONS.get(torch, ""))
                    if item)
    what = "custom operator extension" if kind == HARNESS else "custom extension with std::ostringstream"
    return Mix(f"torch {torch} + {what} (compiled against torch {headers})", replace, (kind,), why, headers=headers)


OLDER, NEWER, CONTROL = ("extension built for the previous torch", "extension built for the next torch",
                         "control: built for this torch")
MIXES: tuple[Mix, ...] = (
    # torch_xla beside torch, both directions between neighbours (pre-C++11 2.6 <-> C++11 2.7 is an ABI mix).
    _xla("2.9.0", "2.8.1", "older torch_xla beside a newer torch", ci=True),
    _xla("2.8.0", "2.9.0", "newer torch_xla beside an older torch"),
    _xla("2.8.0", "2.8.1", "control: a release pair"),
    _xla("2.7.0", "2.8.1", "newer torch_xla beside an older torch"),
    _xla("2.8.0", "2.7.0", "older torch_xla beside a newer torch"),
    _xla("2.7.0", "2.7.0", "control: a release pair"),
    _xla("2.6.0", "2.7.0", "ABI mix: pre-C++11 torch, C++11 torch_xla"),
    _xla("2.7.0", "2.6.0", "ABI mix: C++11 torch, pre-C++11 torch_xla"),
    _xla("2.6.0", "2.6.0", "control: a pre-C++11 release pair"),
    _xla("2.9.0", "2.9.0", "control: the host's release pair"),
    # torchvision (pins torch==X exactly)
    _extension("2.9.0", "torchvision", "0.23.0", "2.8", OLDER, ci=True),
    _extension("2.9.0", "torchvision", "0.24.0", "2.9", CONTROL, ci=True),
    _extension("2.8.0", "torchvision", "0.24.0", "2.9", NEWER),
    _extension("2.8.0", "torchvision", "0.23.0", "2.8", CONTROL),
    _extension("2.8.0", "torchvision", "0.22.0", "2.7", OLDER),
    _extension("2.7.0", "torchvision", "0.23.0", "2.8", NEWER),
    _extension("2.7.0", "torchvision", "0.22.0", "2.7", CONTROL),
    _extension("2.7.0", "torchvision", "0.22.1", "2.7.1", "patch-level pin: 0.22.1 pins torch==2.7.1"),
    _extension("2.6.0", "torchvision", "0.22.0", "2.7", "C++11 extension beside a pre-C++11 torch"),
    _extension("2.7.0", "torchvision", "0.21.0", "2.6", "pre-C++11 extension beside a C++11 torch"),
    _extension("2.6.0", "torchvision", "0.21.0", "2.6", CONTROL),
    # torchaudio (pins torch==X exactly)
    _extension("2.9.0", "torchaudio", "2.8.0", "2.8", OLDER, ci=True),
    _extension("2.9.0", "torchaudio", "2.9.0", "2.9", CONTROL, ci=True),
    _extension("2.8.0", "torchaudio", "2.8.0", "2.8", CONTROL),
    _extension("2.8.0", "torchaudio", "2.9.0", "2.9", NEWER),
    _extension("2.8.0", "torchaudio", "2.7.0", "2.7", OLDER),
    _extension("2.7.0", "torchaudio", "2.8.0", "2.8", NEWER),
    _extension("2.7.0", "torchaudio", "2.7.0", "2.7", CONTROL),
    _extension("2.6.0", "torchaudio", "2.7.0", "2.7", "C++11 extension beside a pre-C++11 torch"),
    _extension("2.7.0", "torchaudio", "2.6.0", "2.6", "pre-C++11 extension beside a C++11 torch"),
    _extension("2.6.0", "torchaudio", "2.6.0", "2.6", CONTROL),
    # a custom extension registering an operator, pinned by nothing (class 4 of issue 20)
    _operators("2.9.0", "2.8.0", "operators compiled against the previous torch's headers"),
    _operators("2.8.0", "2.9.0", "operators compiled against the next torch's headers"),
    _operators("2.8.0", "2.7.0", "operators compiled against the previous torch's headers"),
    _operators("2.7.0", "2.8.0", "operators compiled against the next torch's headers"),
    _operators("2.8.0", "2.8.0", "control: operators compiled against this torch's headers"),
    # class 2 of issue 20: C++11, linked against torch 2.7's libc10 (which exports std::__cxx11::basic_ostringstream),
    # beside the pre-C++11 torch 2.6 whose libc10 does not: the loader binds it to libstdc++
    _operators("2.6.0", "2.7.0", "C++11 std::ostringstream beside a pre-C++11 torch", STREAMS),
    _operators("2.7.0", "2.6.0", "pre-C++11 std::ostringstream beside a C++11 torch", STREAMS),
    _operators("2.7.0", "2.7.0", "control: compiled against this torch", STREAMS),
    # issue 34: libraries ld.so does not find, the interpreter as a provider, the extension's own ABI flag
    *(Mix(f"torch 2.9.0 + {kind}", (), (kind,), why, headers="2.9.0") for kind, why in (
        ("xla_images_helper_absent", "DT_NEEDED shipped nowhere (libcudart.so.11.0 on a CUDA 12 host)"),
        ("xla_images_helper_beside", "helper beside the extension, no RPATH/RUNPATH: no implicit $ORIGIN"),
        ("xla_images_helper_runpath", "helper's dependency only on the extension's DT_RUNPATH (not inherited)"),
        ("xla_images_helper_own_runpath", "helper with its own DT_RUNPATH: the extension's DT_RPATH is skipped"),
        ("xla_images_helper_rpath", "control: the helper's dependency on the extension's DT_RPATH (inherited)"),
        ("xla_images_newer_c_api", "calls PyType_GetFullyQualifiedName (CPython 3.13) under 3.11"),
        ("xla_images_c_api", "control: this python's C API"),
        ("xla_images_layout_other", "pre-C++11 code, ABI-neutral symbols, beside the C++11 torch"),
        ("xla_images_layout_same", "control: the same with torch's ABI flag"),
        ("xla_images_pybind11_other", f"pybind11 {OTHER_PYBIND11} module returning torch's c10::DispatchKey"),
        ("xla_images_pybind11_other_own_types", f"pybind11 {OTHER_PYBIND11} module sharing no torch type"),
        ("xla_images_pybind11_torchs", "control: torch's pybind11, returning c10::DispatchKey"))),
    # issue 34's false alarm: a C++11 TorchScript custom class compiled against torch 2.6's headers, under 2.7
    Mix("torch 2.7.0 + TorchScript custom class (C++11, compiled against torch 2.6.0)",
        ("torch==2.7.0", COMPANIONS["2.7.0"]), ("xla_images_classes",),
        "custom class, previous torch's headers, same ABI flag", headers="2.6.0"),
    Mix("torch 2.7.0 + TorchScript custom class (compiled against torch 2.7.0)",
        ("torch==2.7.0", COMPANIONS["2.7.0"]), ("xla_images_classes",),
        "control: custom class compiled against this torch", headers="2.7.0"),
)


def host_site() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit(f"torch is not importable by {sys.executable}: run this with the host venv's python")
    return Path(spec.origin).parent.parent


# --- wheels and overlays ---------------------------------------------------------------------------------------


def fetch_wheel(requirement: str) -> Path:
    """The cp311 x86_64 wheel of name==version, downloaded (without dependencies) once into WHEELS."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*_x86_64.whl"  # cp311-cp311, or py3-none (nvidia-*)
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        platforms = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
        completed = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
             "--implementation", "cp", "--abi", "cp311", *platforms, "-d", str(WHEELS), requirement],
            capture_output=True, text=True, timeout=1800)
        found = sorted(WHEELS.glob(pattern))
        if not found:
            raise RuntimeError(f"cannot download {requirement}: {completed.stderr.strip()[-500:]}")
    return found[0]


def pybind11_include(version: str) -> Path:
    """The include directory of pybind11 `version` (a pure wheel), installed once under WHEELS/overlays."""
    target = WHEELS / "overlays" / f"pybind11-{version}"
    if not (target / ".installed").exists():
        shutil.rmtree(target, ignore_errors=True)
        completed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                                    "--target", str(target), f"pybind11=={version}"], capture_output=True, text=True,
                                   timeout=600)
        if completed.returncode != 0:
            raise RuntimeError(f"cannot install pybind11=={version}: {completed.stderr.strip()[-500:]}")
        (target / ".installed").touch()
    return target / "pybind11" / "include"


def overlay(requirement: str) -> Path:
    """`pip install --no-deps --target` of the wheel, once: WHEELS/overlays/NAME-VERSION."""
    name, version = requirement.split("==")
    target = WHEELS / "overlays" / f"{name}-{version}"
    done = target / ".installed"
    if done.exists():
        return target
    wheel = fetch_wheel(requirement)
    shutil.rmtree(target, ignore_errors=True)
    completed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                                "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0:
        raise RuntimeError(f"cannot install {wheel.name}: {completed.stderr.strip()[-500:]}")
    done.touch()
    return target


def _project(entry: str) -> str:
    """'torch-2.8.0.dist-info' -> 'torch'; 'torch_xla' -> 'torch_xla'."""
    return re.sub(r"-[0-9][^-]*\.dist-info$", "", entry).lower().replace("-", "_")


def site_view(directory: Path, host: Path, overlays: list[Path]) -> Path:
    """A site-packages of hard-linked copies (see `mirror`): the host's entries, except those an overlay provides (by top-level name or
    distribution), plus the overlays' entries."""
    directory.mkdir(parents=True)
    replaced: set[str] = set()
    for target in overlays:
        replaced |= {_project(entry.name) for entry in target.iterdir() if entry.name not in ("bin", ".installed")}
    for entry in host.iterdir():
        if _project(entry.name) not in replaced:
            mirror(entry, directory / entry.name)
    for target in overlays:
        for entry in target.iterdir():
            if entry.name not in ("bin", ".installed"):
                mirror(entry, directory / entry.name)
    return directory


def mirror(source: Path, destination: Path) -> None:
    """destination as a hard-linked copy of source (a file or a directory tree): `abi check` does not follow
    directory links leading out of the tree it is given, so a site-packages view cannot be a farm of symlinks.
    Hard links cost no space; across file systems the files are copied."""
    source = Path(os.path.realpath(source))
    if not source.is_dir():
        try:
            os.link(source, destination)
        except OSError:
            shutil.copy2(source, destination)
        return
    if subprocess.run(["cp", "-al", str(source), str(destination)], capture_output=True).returncode != 0:
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(source, destination, symlinks=True)


# --- prediction and reality ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    mix: str
    predicted: str            # abi verdict: compatible | pin mismatch | abi mismatch | version mismatch
    predicted_missing: list[str]
    predicted_extensions: dict[str, str]  # extension path -> verdict (for extensions of the probed packages)
    summary: str
    reason: str               # why check predicts what it predicts, in a few words
    real: str                 # "works" or the error the import / call ended with
    real_symbol: str | None   # the undefined symbol the loader named, if any
    agree: bool
    seconds_check: float
    seconds_real: float


def probe_code(packages: tuple[str, ...]) -> str:
    return "".join(PROBES[package] for package in packages) + f"print({PROBE_OK!r})\n"


def run_real(view: Path, packages: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(view), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-c", probe_code(packages)], capture_output=True, text=True, env=env,
                          timeout=RUN_TIMEOUT, cwd=tempfile.gettempdir())


def real_outcome(completed: subprocess.CompletedProcess) -> tuple[str, str | None]:
    if completed.returncode == 0 and completed.stdout.strip().endswith(PROBE_OK):
        return "works", None
    match = re.search(r"undefined symbol: (\S+)", completed.stderr)
    lines = [line.strip() for line in completed.stderr.strip().splitlines()
             if line.strip() and "Warning" not in line]
    last = lines[-1] if lines else ""
    if completed.returncode < 0:  # the interpreter died: a crash, not an exception
        name = signal.Signals(-completed.returncode).name
        return f"fails: killed by {name}" + (f" ({last[:200]})" if last else ""), None
    return f"fails: {last[:300] or f'exit {completed.returncode}'}", match.group(1).rstrip(",") if match else None


def _probed(path: str, packages: tuple[str, ...]) -> bool:
    top = path.split("/")[0]
    return any(top.startswith(package) or (package == "torch_xla" and top.startswith("_XLAC"))
               for package in packages)


def _gcc(directory: Path, source: str, output: str, *flags: str) -> None:
    (directory / output).parent.mkdir(parents=True, exist_ok=True)
    (directory / f"{output}.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", f"{output}.c", "-o", output, *flags], cwd=directory, check=True)
    (directory / f"{output}.c").unlink()


def build_helpers(layout: str, directory: Path) -> list[str]:
    """Build the C helper libraries of a layout in the extension's directory; the extension's link flags. "absent"
    builds its helper in build/, which the caller removes once the extension is linked."""
    helper, deep = "int helper_value(void) { return 5; }\n", "int deep_value(void) { return 3; }\n"
    uses_deep = "int deep_value(void);\nint helper_value(void) { return deep_value() + 2; }\n"
    if layout == "absent":  # linked against a library that is not shipped (libcudart.so.11.0 on a CUDA 12 host)
        _gcc(directory, helper, "build/libxla_images_absent.so.11", "-Wl,-soname,libxla_images_absent.so.11")
        return [f"-L{directory / 'build'}", "-l:libxla_images_absent.so.11"]
    if layout == "beside":  # beside the extension, no RPATH/RUNPATH: ld.so has no implicit $ORIGIN
        _gcc(directory, helper, "libgt_helper.so")
        return [f"-L{directory}", "-lgt_helper"]
    _gcc(directory, deep, "deep/libgt_deep.so")
    own = ["-Wl,--enable-new-dtags,-rpath,/nonexistent"] if layout == "helper-runpath" else []
    _gcc(directory, uses_deep, "h/libgt_helper.so", "-Ldeep", "-lgt_deep", *own)
    tags = "--enable-new-dtags" if layout == "runpath" else "--disable-new-dtags"
    return [f"-L{directory / 'h'}", "-lgt_helper", f"-Wl,{tags},-rpath,$ORIGIN/h:$ORIGIN/deep"]


def compile_extension(kind: str, headers_site: Path, target: Path) -> None:
    """BUILT[kind] (or LOADER_KINDS[kind]) compiled against the torch in headers_site, with that torch's ABI (torch
    2.6: pre-C++11) unless the kind sets its own."""
    source, defines, libraries, layout, flag, module, pybind11 = (LOADER_KINDS.get(kind)
                                                                  or (*BUILT[kind], None, None, False, None))
    torch = headers_site / "torch"
    target.mkdir(parents=True)
    include = torch / "include"
    version = next(headers_site.glob("torch-*.dist-info")).name[len("torch-"):]
    flag = flag if flag is not None else 0 if version.startswith("2.6.") else 1
    helpers = build_helpers(layout, target) if layout else []
    python = [f"-I{sysconfig.get_paths()['include']}"] if module else []
    if pybind11:  # its headers before torch's include tree, which bundles torch's pybind11
        python.insert(0, f"-I{pybind11_include(pybind11)}")
    command = ["g++", "-std=c++17", "-O0", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={flag}", *python,
               *(f"-D{define}" for define in defines), f"-I{include}",
               f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", str(GROUND_TRUTH / source), "-o",
               str(target / (MODULE if module else "_ext.so")), f"-L{torch / 'lib'}",
               *(f"-l{library}" for library in libraries), *helpers]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"cannot compile {source}: {completed.stderr[-800:]}")
    shutil.rmtree(target / "build", ignore_errors=True)  # the "absent" layout's library is not shipped


def run_mix(mix: Mix, scratch: Path) -> Outcome:
    view = site_view(scratch / "site", host_site(), [overlay(requirement) for requirement in mix.replace])
    if mix.headers is not None:
        headers_site = host_site() if mix.headers == "2.9.0" else overlay(f"torch=={mix.headers}")
        compile_extension(mix.probes[0], headers_site, view / mix.probes[0])
    started = time.perf_counter()
    report = abi.check_site_packages(view)
    seconds_check = time.perf_counter() - started
    extensions = [item for item in report.extensions if _probed(item.path, mix.probes)]
    started = time.perf_counter()
    real, symbol = real_outcome(run_real(view, mix.probes))
    seconds_real = time.perf_counter() - started
    verdicts = {item.verdict for item in extensions}
    order = (abi.MISSING_LIBRARY, abi.ABI_MISMATCH, abi.ABI_LAYOUT, abi.PYTHON_MISMATCH, abi.VERSION_MISMATCH,
             abi.PYBIND11_MISMATCH, abi.UNCERTAIN, abi.PIN_MISMATCH)
    predicted = next((verdict for verdict in order if verdict in verdicts), abi.COMPATIBLE)
    missing = sorted({item.symbol for extension in extensions for item in extension.missing})
    pins = sorted({f"{item.distribution} pins torch=={item.requires_torch}" for item in extensions
                   if item.pinned_elsewhere})
    headers = [f"compiled against another torch's headers ({item.header_sites} assertion sites, e.g. "
               f"{item.header_differences[0]} not in this torch's)" for item in extensions if item.other_headers]
    libraries = [line.split(";")[0] + ")" for item in extensions for line in item.libraries_not_found]
    evidence = [f"own ABI {item.layout_evidence}" if item.layout_evidence else str(item.pybind11_evidence)
                for item in extensions if item.layout_evidence or item.pybind11_evidence]
    reason = ("library not found: " + ", ".join(libraries) if libraries else
              "; ".join(evidence) if evidence else f"{len(missing)} symbol(s) missing" if missing else "; ".join(pins) + ", symbols resolve"
              if pins else "; ".join(headers) if headers else "all symbols resolve")
    agree = (predicted in abi.LOADS) == (real == "works")
    if agree and predicted != abi.COMPATIBLE and symbol is not None:
        agree = symbol in missing  # the loader's first failing symbol must be one check named
    return Outcome(mix.name, predicted, missing, {item.path: item.verdict for item in extensions}, report.summary,
                   reason, real, symbol, agree, seconds_check, seconds_real)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", action="append", help="run only mixes whose name contains this (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    arguments = parser.parse_args()
    chosen = [mix for mix in MIXES if not arguments.mix or any(part in mix.name for part in arguments.mix)]
    outcomes = []
    for mix in chosen:
        with tempfile.TemporaryDirectory(prefix="abi-mix-") as scratch:
            started = time.perf_counter()
            outcome = run_mix(mix, Path(scratch))
            print(f"{mix.name}: {outcome.predicted} / {outcome.real[:120]} "
                  f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)
            outcomes.append(outcome)
    if arguments.json:
        print(json.dumps([asdict(outcome) for outcome in outcomes], indent=2))
        return
    print("| mix | `abi check` predicts | because | real import + call | agree | check |")
    print("|---|---|---|---|---|---|")
    for outcome in outcomes:
        real = outcome.real if outcome.real_symbol is None else f"fails: undefined symbol `{outcome.real_symbol}`"
        print(f"| {outcome.mix} | {outcome.predicted} | {outcome.reason} | {real.replace('|', '/')} | "
              f"{'yes' if outcome.agree else '**NO**'} | {outcome.seconds_check:.1f} s |")
    print(f"\n{sum(outcome.agree for outcome in outcomes)} of {len(outcomes)} predictions agree")


if __name__ == "__main__":
    main()
