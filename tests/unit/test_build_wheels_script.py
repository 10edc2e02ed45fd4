"""wheel-builds/build-wheels.sh with a rendered parameter file: its --dry-run plan (golden) and real runs
against stub build tools, on the host (--host) and through a stub docker that stands in for the builder image.

The stubs stand in for git, python (setup.py / pip / venv) and bazel, record every call with the environment
variables that choose the ABI and the wheel version, and compile a tiny C++ shared object with g++ using the ABI
flags they were given, exactly where upstream's build would decide it. The script's ABI check then runs the real
the ABI checker (xla_images/abi) on the wheels, so a build that ignores the ABI setting really fails the check.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images import abi, names
from xla_images.abi.standalone import write_zipapp
from xla_images.generate import render
from xla_images.model.flavour import Abi

from golden import GOLDEN, fixed_flavours, update_golden

REPO = Path(__file__).resolve().parents[2]
PRE_CXX11_TAG = "r2.6.0_3.11_tpuvm"
CXX11_TAG = "r2.6.0_3.11_tpuvm_cxx11"
PRE_CXX11_BUILD = "r2.6.0_3.11_precxx11"
CXX11_BUILD = "r2.6.0_3.11_cxx11"

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


STUB_DOCKER = STUB_COMMON + r'''

# `docker build` is recorded; `docker run` is recorded and then runs its command here, with the -e variables,
# as the builder container would (the mounts keep every path the same, so the host paths are right).
args = sys.argv[1:]
record("docker")
if args[0] == "run":
    env, index = dict(os.environ), 1
    while args[index].startswith("-"):
        if args[index] == "-e":
            name, _, value = args[index + 1].partition("=")
            env[name] = value
        index += 1 if args[index] == "--rm" else 2
    command = args[index + 1:]  # after the image
    os.execvpe(command[0], command, env)
'''


def parameters(build: str) -> str:
    return render.render_wheel_builds(list(fixed_flavours().values()))[f"wheel-builds/{build}.env"]


def install_script(root: Path, build: str) -> Path:
    """The committed script and the rendered parameter file, where they live: ROOT/wheel-builds/."""
    folder = root / "wheel-builds"
    folder.mkdir(parents=True)
    path = folder / "build-wheels.sh"
    shutil.copy2(REPO / "wheel-builds" / "build-wheels.sh", path)
    (folder / f"{build}.env").write_text(parameters(build))
    return path


def install_stubs(directory: Path) -> Path:
    directory.mkdir()
    for name, text in (("python3.11", STUB_PYTHON), ("bazel", STUB_BAZEL), ("git", STUB_GIT),
                       ("docker", STUB_DOCKER)):
        path = directory / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    return directory


def stub_env(stubs: Path, log: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("ABI_TOOL", "ABI_PYTHON", "XLA_IMAGES_ROOT", "BUILDER_IMAGE")}
    env.update(PATH=f"{stubs}:{env['PATH']}", STUB_LOG=str(log), **extra)
    return env


def calls(log: Path, tool: str | None = None) -> list[dict]:
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [entry for entry in entries if tool is None or entry["tool"] == tool]


# --- parameter files: one per (release, python, ABI) ---------------------------------------------------------

def test_cpu_and_tpu_flavours_share_one_wheel_build() -> None:
    flavours = fixed_flavours()
    assert flavours["r2.6.0_3.11_cpu_cxx11"].wheel_build == flavours[CXX11_TAG].wheel_build
    assert flavours[CXX11_TAG].wheel_build.name == CXX11_BUILD
    assert flavours[PRE_CXX11_TAG].wheel_build.name == PRE_CXX11_BUILD
    assert flavours[PRE_CXX11_TAG].wheel_build != flavours[CXX11_TAG].wheel_build
    files = render.render_wheel_builds(list(flavours.values()))
    builds = {flavour.wheel_build for flavour in flavours.values()}
    assert len(files) == len(builds) < len(flavours)
    assert "FLAVOURS='r2.6.0_3.11_tpuvm_cxx11 r2.6.0_3.11_cpu_cxx11'\n" in files[f"wheel-builds/{CXX11_BUILD}.env"]


@pytest.mark.parametrize("build", [PRE_CXX11_BUILD, CXX11_BUILD, "r2.9.0_3.11_cxx11"])
def test_golden_parameters(build: str) -> None:
    text = parameters(build)
    golden = GOLDEN / "render" / "wheel-builds" / f"{build}.env"
    if update_golden():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_parameter_file_lacking_a_parameter_is_refused(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    env_file = script.parent / f"{CXX11_BUILD}.env"
    env_file.write_text(env_file.read_text().replace("XLA_REV=v2.6.0\n", ""))
    result = subprocess.run(["bash", str(script), CXX11_BUILD, "--dry-run"], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 1
    assert f"{env_file} does not set XLA_REV" in result.stderr


def test_unknown_or_missing_build_names_the_builds(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    unknown = subprocess.run(["bash", str(script), "r9.9.9_3.11_cxx11", "--dry-run"], capture_output=True,
                             text=True, check=False)
    assert unknown.returncode == 2
    assert "no wheel build 'r9.9.9_3.11_cxx11'" in unknown.stderr and f"Builds here: {CXX11_BUILD}" in unknown.stderr
    missing = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "name the wheel build" in missing.stderr


# --- --help and argument errors -----------------------------------------------------------------------------

def test_help_names_every_option(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    result = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for option in ("--workdir", "--output", "--jobs", "--python", "--host", "--dry-run", "ABI_TOOL",
                   "BUILDER_IMAGE"):
        assert option in result.stdout
    assert f"Builds here: {CXX11_BUILD}" in result.stdout


@pytest.mark.parametrize("arguments, message", [
    (["--frobnicate"], "unknown argument: --frobnicate"),
    (["--jobs", "many", "--dry-run"], "--jobs must be a positive number"),
    (["--workdir"], "--workdir needs a value"),
    ([CXX11_BUILD], "one wheel build at a time"),
])
def test_bad_arguments_are_explained(tmp_path: Path, arguments: list[str], message: str) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    result = subprocess.run(["bash", str(script), CXX11_BUILD, *arguments], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("host, missing", [(["--host"], "python-that-does-not-exist"), ([], "docker")])
def test_real_run_without_tools_says_what_is_missing(tmp_path: Path, host: list[str], missing: str) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if shutil.which("docker", path=env["PATH"]) and not host:
        pytest.skip("docker is installed in /usr/bin here")
    result = subprocess.run(["bash", str(script), CXX11_BUILD, *host, "--python", "python-that-does-not-exist",
                             "--workdir", str(tmp_path / "work")], capture_output=True, text=True, env=env,
                            check=False)
    assert result.returncode == 1
    assert "not on PATH" in result.stderr and missing in result.stderr
    assert not (tmp_path / "work").exists()


# --- dry run ------------------------------------------------------------------------------------------------

def dry_run(tmp_path: Path, build: str, *extra: str) -> str:
    script = install_script(tmp_path, build)
    log = tmp_path / "calls.jsonl"
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, log, ABI_TOOL="/opt/xla-images/abi.py")
    result = subprocess.run(["bash", str(script), build, "--dry-run", "--workdir", str(tmp_path / "work"),
                             "--output", str(tmp_path / "out"), "--jobs", "4", *extra],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert not log.exists(), "a dry run must not call any tool"
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
    return result.stdout.replace(str(tmp_path), "<tmp>")


def check_golden(text: str, name: str) -> None:
    golden = GOLDEN / "build-wheels" / name
    if update_golden():
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("build", [PRE_CXX11_BUILD, CXX11_BUILD])
def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path, build: str) -> None:
    check_golden(dry_run(tmp_path, build, "--host"), f"{build}.dry-run.txt")


def test_dry_run_in_the_builder_prints_the_image_the_container_and_the_plan(tmp_path: Path) -> None:
    text = dry_run(tmp_path, CXX11_BUILD)
    check_golden(text.replace(f"{os.getuid()}:{os.getgid()}", "<uid>:<gid>"), f"{CXX11_BUILD}.builder.dry-run.txt")
    host_plan = (GOLDEN / "build-wheels" / f"{CXX11_BUILD}.dry-run.txt").read_text().splitlines()
    # The builder adds its image and container, then plans exactly what --host plans.
    assert text.splitlines()[-len(host_plan) + 1:] == host_plan[1:]
    assert "docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm --tag xla-images/wheel-builder:3.11" in text


def test_dry_run_plans_differ_only_in_abi_and_names() -> None:
    pre = (GOLDEN / "build-wheels" / f"{PRE_CXX11_BUILD}.dry-run.txt").read_text()
    cxx11 = (GOLDEN / "build-wheels" / f"{CXX11_BUILD}.dry-run.txt").read_text()
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
    # Both flavours of the build are named for the next steps.
    assert "lock r2.6.0_3.11_tpuvm_cxx11 r2.6.0_3.11_cpu_cxx11 &&" in cxx11


# --- real runs with stub tools ------------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("build, wanted, mode", [(PRE_CXX11_BUILD, Abi.PRE_CXX11, "--host"),
                                                 (CXX11_BUILD, Abi.CXX11, "--host"),
                                                 (CXX11_BUILD, Abi.CXX11, "builder")])
def test_real_run_builds_checks_and_copies_both_wheels(tmp_path: Path, build: str, wanted: Abi, mode: str) -> None:
    script = install_script(tmp_path, build)
    flag = str(wanted.glibcxx_use_cxx11_abi)
    version = "2.6.0" + ("+cxx11" if wanted is Abi.CXX11 else "")
    log = tmp_path / "calls.jsonl"
    stubs = install_stubs(tmp_path / "stubs")
    if wanted is Abi.CXX11:
        # The one-file tool next to the script, as when the folder is copied elsewhere.
        write_zipapp(script.parent / "abi.pyz")
        env, output, extra = stub_env(stubs, log), tmp_path / "wheelhouse" / "built", []
    else:
        env = stub_env(stubs, log, XLA_IMAGES_ROOT=str(REPO))
        output, extra = tmp_path / "out", ["--output", str(tmp_path / "out")]
    if mode == "--host":
        extra.append("--host")
    result = subprocess.run(["bash", str(script), build, "--workdir", str(tmp_path / "work"), "--jobs", "3",
                             *extra], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    wheels = sorted(path.name for path in output.iterdir())
    assert wheels == [f"torch-{version}-cp311-cp311-linux_x86_64.whl",
                      f"torch_xla-{version}-cp311-cp311-linux_x86_64.whl"]
    for name in wheels:  # independently of the script's own check
        assert abi.inspect_path(output / name).abi == wanted.value
    assert result.stdout.count(f"abi {wanted.value}, as wanted") == 2

    dockers = [call["argv"] for call in calls(log, "docker")]
    if mode == "--host":
        assert dockers == []
    else:
        built, ran = dockers
        assert built == ["build", "--build-arg", "BASE_IMAGE=python:3.11-slim-bookworm", "--tag",
                         "xla-images/wheel-builder:3.11", str(script.parent)]
        for folder in (tmp_path, tmp_path / "work", output):
            assert f"{folder}:{folder}" in ran
        image = ran.index("xla-images/wheel-builder:3.11")
        assert ran[image + 1:image + 5] == ["bash", str(script), str(script.parent / f"{build}.env"), "--host"]

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
    # The build venv gets upstream's build requirements and `wheel`, nothing of ours: the ABI check is stdlib only.
    assert any(argv[3:] == ["-r", str(tmp_path / "work" / "pytorch" / "requirements.txt"), "wheel"] for argv in installs)


@needs_gxx
@pytest.mark.parametrize("build, compiled_as", [(PRE_CXX11_BUILD, "1"), (CXX11_BUILD, "0")])
def test_a_build_that_ignores_the_abi_fails_the_check_and_copies_nothing(tmp_path: Path, build: str,
                                                                           compiled_as: str) -> None:
    script = install_script(tmp_path, build)
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, tmp_path / "calls.jsonl", XLA_IMAGES_ROOT=str(REPO), STUB_COMPILE_ABI=compiled_as)
    result = subprocess.run(["bash", str(script), build, "--host", "--workdir", str(tmp_path / "work"),
                             "--output", str(tmp_path / "out"), "--jobs", "1"], capture_output=True, text=True,
                            env=env, check=False)
    assert result.returncode == 1
    wanted = (Abi.PRE_CXX11 if build == PRE_CXX11_BUILD else Abi.CXX11).value
    assert f"not '{wanted}'" in result.stderr and "did not honour _GLIBCXX_USE_CXX11_ABI" in result.stderr
    assert not (tmp_path / "out").exists()


@needs_gxx
def test_wrong_python_is_refused(tmp_path: Path) -> None:
    script = install_script(tmp_path, CXX11_BUILD)
    stubs = install_stubs(tmp_path / "stubs")
    env = stub_env(stubs, tmp_path / "calls.jsonl", XLA_IMAGES_ROOT=str(REPO), STUB_PYTHON_VERSION="3.12")
    result = subprocess.run(["bash", str(script), CXX11_BUILD, "--host", "--workdir", str(tmp_path / "work")],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 1
    assert "is python 3.12, this build needs 3.11" in result.stderr


def test_the_committed_script_is_executable_and_not_generated() -> None:
    script = REPO / "wheel-builds" / "build-wheels.sh"
    assert os.access(script, os.X_OK)
    assert names.GENERATED_MARK not in script.read_text()  # render must never treat it as its own
