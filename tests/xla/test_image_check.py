"""`xla-images-check` against the host's real venv (torch + torch_xla), as the image runs it: the zipapp that
run.building.check_tool writes, run by a python on the venv. The mutations happen in a hard-linked copy of the venv (new
files and renamed directories only: no linked file is written), each in its own copy.

Its figures (wall time) are benchmarks/bench_image_check.py's.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.run.building.check_tool import write_check_tool

HOST_VENV = Path(sys.prefix)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abi" / "ground_truth"
pytestmark = pytest.mark.skipif(
    not (any(HOST_VENV.glob("lib/python3.*/site-packages/torch/lib/libtorch*.so*"))
         and any(HOST_VENV.glob("lib/python3.*/site-packages/torch_xla-*.dist-info"))),
    reason=f"{HOST_VENV} has no torch + torch_xla")


def _site(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3.*/site-packages")
    return site


def _version(site: Path, project: str) -> str:
    (info,) = site.glob(f"{project}-*.dist-info")
    return info.name[len(project) + 1:-len(".dist-info")]


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_check_tool(tmp_path_factory.mktemp("tool") / "xla-images-check")


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host venv's pins as the image's constraints file holds them (render's format)."""
    site = _site(HOST_VENV)
    path = tmp_path_factory.mktemp("facts") / "constraints.txt"
    path.write_text("# flavour: host-venv (python 3.11, cxx11)\n"
                    f"torch=={_version(site, 'torch')}\ntorch-xla=={_version(site, 'torch_xla')}\n")
    return path


@pytest.fixture()
def venv(tmp_path: Path) -> Path:
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(HOST_VENV), str(copy)], check=True, timeout=300)
    return copy


def run(tool: Path, venv: Path, constraints: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-IS", str(tool), "--venv", str(venv), "--constraints",
                           str(constraints), "--abi", "cxx11", *extra], capture_output=True, text=True, timeout=600)


def test_the_host_venv_holds_its_pins(tool: Path, constraints: Path) -> None:
    result = run(tool, HOST_VENV, constraints, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and not report["problems"]
    imports = report["imports"]
    assert {"torch", "torch_xla"} <= set(imports["imported"]) and imports["torch_abi"] == "cxx11"
    assert imports["children"] == 1 and "not called" in imports["exercised"]


def test_a_changed_torch_is_named_with_both_versions(tool: Path, constraints: Path, venv: Path) -> None:
    site = _site(venv)
    (old,) = site.glob("torch-*.dist-info")
    new = site / "torch-2.10.0.dist-info"
    shutil.copytree(old, new, copy_function=shutil.copy)  # real copies: the links stay the host's files
    shutil.rmtree(old)
    metadata = (new / "METADATA").read_text()
    (new / "METADATA").unlink()
    (new / "METADATA").write_text(metadata.replace(f"Version: {old.name[6:-10]}\n", "Version: 2.10.0\n", 1))
    result = run(tool, venv, constraints)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"problem: torch changed {old.name[6:-10]} -> 2.10.0" in result.stdout


def test_an_unsatisfied_requirement_is_named(tool: Path, constraints: Path, venv: Path) -> None:
    info = _site(venv) / "needs_missing-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: needs-missing\nVersion: 1.0\n"
                                   "Requires-Dist: xla-images-no-such-package>=1\n")
    result = run(tool, venv, constraints)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "problem: unsatisfied requirement: needs-missing 1.0 requires xla-images-no-such-package" in result.stdout


def test_an_extension_of_the_other_abi_is_named_with_its_symbol(tool: Path, constraints: Path, venv: Path) -> None:
    """A package that loads its library (as torch.ops.load_library does) built with the other ABI: its import
    fails, and the explanation names the symbol, its ABI and the static reader's verdict."""
    site = _site(venv)
    include = site / "torch" / "include"
    if not include.is_dir():
        pytest.skip("torch has no headers")
    (site / "harness_ext").mkdir()
    (site / "harness_ext" / "__init__.py").write_text(
        "import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), '_ext.so'))\n")
    output = site / "harness_ext" / "_ext.so"
    command = ["g++", "-std=c++17", "-O0", "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=0", f"-I{include}",
               str(FIXTURES / "strings_api.cpp"), "-o", str(output), f"-L{site / 'torch' / 'lib'}", "-lc10"]
    compiled = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    result = run(tool, venv, constraints, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    problems = [problem["message"] for problem in json.loads(result.stdout)["problems"]]
    (message,) = [text for text in problems if "harness_ext" in text]
    assert message.startswith("`import harness_ext` fails: OSError") and "undefined symbol _Z" in message, message
    assert "other ABI" in message and "missing symbol _Z" in message, message


def test_a_so_that_is_not_elf_fails_its_import(tool: Path, constraints: Path, venv: Path) -> None:
    (_site(venv) / "broken.cpython-311-x86_64-linux-gnu.so").write_bytes(b"not an ELF file\n" * 8)
    result = run(tool, venv, constraints, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    (problem,) = [problem["message"] for problem in json.loads(result.stdout)["problems"]]
    assert problem.startswith("`import broken` fails: ImportError") and "Traceback" not in result.stderr


# Extension packages from the index, judged against what they do in the same venv: import and one op.
FBGEMM_OP = ("import torch, fbgemm_gpu\n"
             "assert torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2, 3])).tolist() == [0, 1, 3, 6]\n")
TORCHAO_OP = ("import torch\nfrom torchao.quantization import quantize_, Int8WeightOnlyConfig\n"
              "model = torch.nn.Sequential(torch.nn.Linear(32, 32))\nquantize_(model, Int8WeightOnlyConfig())\n"
              "assert model(torch.randn(2, 32)).shape == (2, 32)\n")


@pytest.mark.parametrize("requirement, program, works", [
    ("fbgemm-gpu-cpu==1.4.2", FBGEMM_OP, True),  # built for torch 2.9: the old static check failed it
    ("fbgemm-gpu-cpu==1.3.0", FBGEMM_OP, False),  # built for torch 2.8: python aborts at import
    ("torchao==0.14.1", TORCHAO_OP, True),  # with a cp310 CUDA prototype .so nothing imports
])
def test_the_check_exits_as_the_package_works(tool: Path, constraints: Path, venv: Path, requirement: str,
                                              program: str, works: bool) -> None:
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--quiet",
                                "--disable-pip-version-check", "--no-cache-dir", requirement],
                               capture_output=True, text=True, timeout=600)
    if installed.returncode != 0:
        pytest.skip(f"the index cannot give {requirement}: {installed.stderr[-300:]}")
    reality = subprocess.run([str(venv / "bin" / "python"), "-c", program], capture_output=True, text=True,
                             timeout=600)
    assert (reality.returncode == 0) is works, f"the package changed: exit {reality.returncode} {reality.stderr[-800:]}"
    result = run(tool, venv, constraints)
    assert result.returncode == (0 if works else 1), result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("broken", ["no-venv", "no-constraints"])
def test_missing_facts_or_venv_is_one_line_exit_2(tool: Path, constraints: Path, tmp_path: Path,
                                                  broken: str) -> None:
    venv = tmp_path / "absent" if broken == "no-venv" else HOST_VENV
    facts = tmp_path / "absent.txt" if broken == "no-constraints" else constraints
    result = subprocess.run([sys.executable, "-IS", str(tool), "--venv", str(venv), "--constraints", str(facts)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("xla-images-check: error [check-") and "absent" in line
