"""build-wheels.sh as rendered: its --dry-run plan (golden) and a real run against stub build tools.

The stubs stand in for git, python (setup.py / pip / venv) and bazel, record every call with the environment
variables that choose the ABI and the wheel version, and compile a tiny C++ shared object with g++ using the ABI
flags they were given, exactly where upstream's build would decide it. The script's ABI check then runs the real
xla_images/abi.py on the wheels, so a build that ignores the ABI setting really fails the check.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images import abi, render
from xla_images.flavour import Abi

from test_render import GOLDEN, fixed_flavours, update_golden

REPO = Path(__file__).resolve().parents[2]
PRE_CXX11_TAG = "r2.6.0_3.11_tpuvm"
CXX11_TAG = "r2.6.0_3.11_tpuvm_cxx11"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None and not os.environ.get("CI"),
                               reason="g++ is needed to compile the stub libraries")

STUB_COMMON = r'''#!{python}
import json, os, subprocess, sys, zipfile
from pathlib import Path

WATCHED = ("_GLIBCXX_USE_CXX11_ABI", "CXX_ABI", "PYTORCH_BUILD_VERSION", "PYTORCH_BUILD_NUMBER",
           "TORCH_XLA_VERSION", "GIT_VERSIONED_XLA_BUILD", "BUILD_CPP_TESTS", "TPUVM_MODE", "BUNDLE_LIBTPU",
           "USE_CUDA", "MAX_JOBS", "BAZEL_JOBS")
SOURCE = "#include <string>\nstd::string stub_describe(const std::string& name) {{ return name + \" (stub)\"; }}\n"


def record(tool, **extra):
    entry = {{"tool": tool, "argv": sys.argv[1:], "cwd": os.getcwd(),
              "env": {{name: os.environ[name] for name in WATCHED if name in os.environ}}, **extra}}
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write(json.dumps(entry) + "\n")


def compile_library(flags, output):
    """g++ decides the ABI from the -D flags it is given (none: the compiler's default, C++11)."""
    forced = os.environ.get("STUB_COMPILE_ABI")
    if forced is not None:  # simulate a build that ignored what it was asked for
        flags = [f"-D_GLIBCXX_USE_CXX11_ABI={{forced}}"]
    source = Path(output).with_suffix(".cpp")
    source.write_text(SOURCE)
    subprocess.run(["g++", "-shared", "-fPIC", *flags, "-o", str(output), str(source)], check=True)


def write_wheel(directory, name, version, members):
    dist_info = f"{{name}}-{{version}}.dist-info"
    path = Path(directory) / f"{{name}}-{{version}}-cp311-cp311-linux_x86_64.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{{dist_info}}/METADATA", f"Metadata-Version: 2.1\nName: {{name}}\nVersion: {{version}}\n")
        archive.writestr(f"{{dist_info}}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
        archive.writestr(f"{{dist_info}}/RECORD", "")
    return path
'''

STUB_PYTHON = STUB_COMMON + r'''

REAL = {python!r}


def setup_py():
    here = Path.cwd()
    if here.name == "xla":
        # As upstream's setup.py: CXX_ABI, else nothing (the torch flag lookup is not simulated), into bazel.
        flags = [f"--cxxopt=-D_GLIBCXX_USE_CXX11_ABI={{os.environ['CXX_ABI']}}"] if "CXX_ABI" in os.environ else []
        subprocess.run(["bazel", "build", "//:_XLAC.so", *flags], check=True)
        library = (here / "bazel-bin" / "_XLAC.so").read_bytes()
        version = os.environ.get("TORCH_XLA_VERSION", "2.6.0") + (
            "" if os.environ.get("GIT_VERSIONED_XLA_BUILD", "true").lower() in ("0", "false") else "+git1a2b3c4")
        write_wheel(here / "dist", "torch_xla", version,
                    {{"torch_xla/__init__.py": "", "_XLAC.cpython-311-x86_64-linux-gnu.so": library}})
    else:
        abi = os.environ.get("_GLIBCXX_USE_CXX11_ABI")
        output = here / "build" / "libtorch_cpu.so"
        output.parent.mkdir(parents=True, exist_ok=True)
        compile_library([f"-D_GLIBCXX_USE_CXX11_ABI={{abi}}"] if abi is not None else [], output)
        version = os.environ.get("PYTORCH_BUILD_VERSION", "2.6.0a0+gitdeadbee")
        write_wheel(here / "dist", "torch", version,
                    {{"torch/__init__.py": "", "torch/lib/libtorch_cpu.so": output.read_bytes()}})


args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    record("python")
    bin_dir = Path(args[2]) / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(os.path.realpath(__file__))
elif args[:2] == ["-m", "pip"]:
    record("python")
elif args[:1] == ["-c"] and "version_info" in args[1]:
    record("python")
    print(os.environ.get("STUB_PYTHON_VERSION", "3.11"))
elif args[:2] == ["setup.py", "bdist_wheel"]:
    record("python")
    setup_py()
else:  # the ABI checker and its JSON parsing run for real
    os.execv(REAL, [REAL, *args])
'''

STUB_BAZEL = STUB_COMMON + r'''

rc = Path.cwd() / ".bazelrc.user"
rc_flags = [line.split("=", 1)[1] for line in (rc.read_text().splitlines() if rc.exists() else [])
            if line.startswith("build --cxxopt=")]
arg_flags = [arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--cxxopt=")]
record("bazel", rc_cxxopts=rc_flags, arg_cxxopts=arg_flags)
(Path.cwd() / "bazel-bin").mkdir(exist_ok=True)
# bazel reads the rc file first, then the command line: later -D definitions win in g++.
compile_library(rc_flags + arg_flags, Path.cwd() / "bazel-bin" / "_XLAC.so")
'''

STUB_GIT = STUB_COMMON + r'''

record("git")
args = sys.argv[1:]
if args[0] == "clone":
    target = Path(args[-1])
    (target / ".git").mkdir(parents=True)
    if target.name == "pytorch":
        (target / "requirements.txt").write_text("typing-extensions\n")
'''


def rendered_script(tag: str) -> str:
    return render.render_flavour(fixed_flavours()[tag])["build-wheels.sh"]


def install_script(root: Path, tag: str) -> Path:
    """The script where `render` puts it: ROOT/Dockerfiles/<tag>/build-wheels.sh."""
    path = root / "Dockerfiles" / tag / "build-wheels.sh"
    path.parent.mkdir(parents=True)
    path.write_text(rendered_script(tag))
    path.chmod(0o755)
    return path


def install_stubs(directory: Path) -> Path:
    directory.mkdir()
    for name, text in (("python3.11", STUB_PYTHON), ("bazel", STUB_BAZEL), ("git", STUB_GIT)):
        path = directory / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    return directory


def stub_env(stubs: Path, log: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("ABI_TOOL", "ABI_PYTHON", "XLA_IMAGES_ROOT")}
    env.update(PATH=f"{stubs}:{env['PATH']}", STUB_LOG=str(log), **extra)
    return env


def calls(log: Path, tool: str | None = None) -> list[dict]:
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [entry for entry in entries if tool is None or entry["tool"] == tool]


# --- --help and argument errors -----------------------------------------------------------------------------

def test_help_names_every_option(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_TAG)
    result = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for option in ("--workdir", "--output", "--jobs", "--python", "--dry-run", "ABI_TOOL"):
        assert option in result.stdout
    assert "2.6.0+cxx11" in result.stdout


@pytest.mark.parametrize("arguments, message", [
    (["--frobnicate"], "unknown argument: --frobnicate"),
    (["--jobs", "many", "--dry-run"], "--jobs must be a positive number"),
    (["--workdir"], "--workdir needs a value"),
])
def test_bad_arguments_are_explained(tmp_path: Path, arguments: list[str], message: str) -> None:
    script = install_script(tmp_path, CXX11_TAG)
    result = subprocess.run(["bash", str(script), *arguments], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_real_run_without_tools_says_what_is_missing(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_TAG)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(script), "--python", "python-that-does-not-exist", "--workdir",
                             str(tmp_path / "work")], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 1
    assert "not on PATH" in result.stderr and "python-that-does-not-exist" in result.stderr
    assert not (tmp_path / "work").exists()


# --- dry run ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", [PRE_CXX11_TAG, CXX11_TAG])
def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path, tag: str) -> None:
    script = install_script(tmp_path, tag)
    log = tmp_path / "calls.jsonl"
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, log, ABI_TOOL="/opt/xla-images/abi.py")
    result = subprocess.run(["bash", str(script), "--dry-run", "--workdir", str(tmp_path / "work"),
                             "--output", str(tmp_path / "out"), "--jobs", "4"],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert not log.exists(), "a dry run must not call any tool"
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
    text = result.stdout.replace(str(tmp_path), "<tmp>")
    golden = GOLDEN / "build-wheels" / f"{tag}.dry-run.txt"
    if update_golden():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_dry_run_plans_differ_only_in_abi_and_names() -> None:
    pre = (GOLDEN / "build-wheels" / f"{PRE_CXX11_TAG}.dry-run.txt").read_text()
    cxx11 = (GOLDEN / "build-wheels" / f"{CXX11_TAG}.dry-run.txt").read_text()
    assert "_GLIBCXX_USE_CXX11_ABI=0" in pre and "CXX_ABI=0" in pre and "_GLIBCXX_USE_CXX11_ABI=1" not in pre
    assert "_GLIBCXX_USE_CXX11_ABI=1" in cxx11 and "CXX_ABI=1" in cxx11 and "_GLIBCXX_USE_CXX11_ABI=0" not in cxx11
    # 2.6's default ABI is pre-C++11: its wheels carry no local label, the C++11 build's carry +cxx11.
    assert "PYTORCH_BUILD_VERSION=2.6.0 " in pre and "TORCH_XLA_VERSION=2.6.0 " in pre
    assert "PYTORCH_BUILD_VERSION=2.6.0+cxx11 " in cxx11 and "TORCH_XLA_VERSION=2.6.0+cxx11 " in cxx11
    for plan in (pre, cxx11):
        for setting in ("BUILD_CPP_TESTS=0", "TPUVM_MODE=1", "BUNDLE_LIBTPU=0", "GIT_VERSIONED_XLA_BUILD=false"):
            assert setting in plan
        # The check comes before the copy: a wheel of the wrong ABI never reaches the wheelhouse.
        assert plan.index("inspect --json") < plan.index("+ cp -f")


# --- real runs with stub tools ------------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("tag, wanted", [(PRE_CXX11_TAG, Abi.PRE_CXX11), (CXX11_TAG, Abi.CXX11)])
def test_real_run_builds_checks_and_copies_both_wheels(tmp_path: Path, tag: str, wanted: Abi) -> None:
    script = install_script(tmp_path, tag)
    flag = str(wanted.glibcxx_use_cxx11_abi)
    version = "2.6.0" + fixed_flavours()[tag].wheel_local_version
    log = tmp_path / "calls.jsonl"
    stubs = install_stubs(tmp_path / "stubs")
    if wanted is Abi.CXX11:
        # The shipped copy next to the script, as when the folder is copied into a build container.
        shutil.copy(REPO / "xla_images" / "abi.py", script.parent / "abi.py")
        env, output, extra = stub_env(stubs, log), tmp_path / "wheelhouse" / "built", []
    else:
        env = stub_env(stubs, log, XLA_IMAGES_ROOT=str(REPO))
        output, extra = tmp_path / "out", ["--output", str(tmp_path / "out")]
    result = subprocess.run(["bash", str(script), "--workdir", str(tmp_path / "work"), "--jobs", "3", *extra],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    wheels = sorted(path.name for path in output.iterdir())
    assert wheels == [f"torch-{version}-cp311-cp311-linux_x86_64.whl",
                      f"torch_xla-{version}-cp311-cp311-linux_x86_64.whl"]
    for name in wheels:  # independently of the script's own check
        assert abi.inspect_path(output / name).abi == wanted.value
    assert result.stdout.count(f"abi {wanted.value}, as wanted") == 2

    clones = [call["argv"] for call in calls(log, "git")]
    assert [argv[:3] for argv in clones] == [["clone", "--branch", "v2.6.0"]] * 2
    assert clones[0][-2].endswith("pytorch.git") and clones[1][-2].endswith("xla.git")

    torch_build, xla_build = [call for call in calls(log, "python") if call["argv"][:1] == ["setup.py"]]
    assert torch_build["cwd"] == str(tmp_path / "work" / "pytorch")
    assert torch_build["env"]["_GLIBCXX_USE_CXX11_ABI"] == flag
    assert torch_build["env"]["PYTORCH_BUILD_VERSION"] == version
    assert torch_build["env"]["PYTORCH_BUILD_NUMBER"] == "1"
    assert torch_build["env"]["USE_CUDA"] == "0" and torch_build["env"]["MAX_JOBS"] == "3"
    assert xla_build["cwd"] == str(tmp_path / "work" / "pytorch" / "xla")
    assert xla_build["env"]["CXX_ABI"] == flag
    assert xla_build["env"]["TORCH_XLA_VERSION"] == version
    assert {key: xla_build["env"][key] for key in ("BUILD_CPP_TESTS", "TPUVM_MODE", "BUNDLE_LIBTPU",
                                                   "GIT_VERSIONED_XLA_BUILD", "BAZEL_JOBS")} == {
        "BUILD_CPP_TESTS": "0", "TPUVM_MODE": "1", "BUNDLE_LIBTPU": "0", "GIT_VERSIONED_XLA_BUILD": "false",
        "BAZEL_JOBS": "3"}
    (bazel,) = calls(log, "bazel")
    assert bazel["arg_cxxopts"] == [f"-D_GLIBCXX_USE_CXX11_ABI={flag}"]
    assert bazel["rc_cxxopts"] == [f"-D_GLIBCXX_USE_CXX11_ABI={flag}"]

    installs = [call["argv"] for call in calls(log, "python") if call["argv"][:3] == ["-m", "pip", "install"]]
    assert any("--no-deps" in argv and argv[-1].endswith(wheels[0]) for argv in installs)


@needs_gxx
@pytest.mark.parametrize("tag, compiled_as", [(PRE_CXX11_TAG, "1"), (CXX11_TAG, "0")])
def test_a_build_that_ignores_the_abi_fails_the_check_and_copies_nothing(tmp_path: Path, tag: str,
                                                                           compiled_as: str) -> None:
    script = install_script(tmp_path, tag)
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, tmp_path / "calls.jsonl", XLA_IMAGES_ROOT=str(REPO), STUB_COMPILE_ABI=compiled_as)
    result = subprocess.run(["bash", str(script), "--workdir", str(tmp_path / "work"), "--output",
                             str(tmp_path / "out"), "--jobs", "1"], capture_output=True, text=True, env=env,
                            check=False)
    assert result.returncode == 1
    wanted = fixed_flavours()[tag].abi.value
    assert f"not '{wanted}'" in result.stderr and "did not honour _GLIBCXX_USE_CXX11_ABI" in result.stderr
    assert not (tmp_path / "out").exists()


@needs_gxx
def test_wrong_python_is_refused(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_TAG)
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, tmp_path / "calls.jsonl", XLA_IMAGES_ROOT=str(REPO), STUB_PYTHON_VERSION="3.12")
    result = subprocess.run(["bash", str(script), "--workdir", str(tmp_path / "work")], capture_output=True,
                            text=True, env=env, check=False)
    assert result.returncode == 1
    assert "is python 3.12, this flavour needs 3.11" in result.stderr
