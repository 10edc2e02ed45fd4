"""Checks every xla-images image must pass. Run through `xla_images.run.checking.checks.run` (`build.py test`), which
provides the `target` fixture: the flavour, the image reference, the site's CA bundle and whether to run as
on a TPU VM.

In-image facts come from a container of the image (sleeping; testinfra's docker backend runs commands in
it), removed when the session ends. Labels, env and history come from the engine, layers from `docker save`.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Iterator

import pytest
import testinfra

from xla_images import abi, resources
from xla_images.abi.standalone import write_zipapp
from xla_images.model import running
from xla_images.model.flavour import COMPANIONS
from xla_images.model.target import Target
from xla_images.model.lockfile import constraints_digest
from xla_images.names import (CHECK_TOOL, CONSTRAINTS_LABEL, CONSTRAINTS_SHA256_LABEL, FLAVOUR_ID_LABEL,
                              IMAGE_CONSTRAINTS, LABEL_PREFIX, local_ref)
from xla_images.run.checking import checks, nightly_check, smoke_runner
from xla_images.run import engine
from xla_images.run.checking.checks import CheckTarget, LayerScan

COMPILERS = ("gcc", "cc", "g++", "c++", "clang", "clang++", "ld")
# What a devel image must have on PATH, and how many layers it may add to its runtime image's (the template's
# devel stage makes two: the apt packages, then setuptools and wheel).
DEVEL_TOOLS = ("g++", "ninja")
MAX_DEVEL_LAYERS = 3
# Where the example extension is copied, built and installed, in the devel and the runtime container.
EXTENSION_DIR = "/tmp/xla-images-extension"
# Companions too: installed exactly when the flavour installs them (`companions:`), at the recorded version.
PACKAGES = ("torch", "torch_xla", "libtpu", *COMPANIONS)
# Where the standalone ABI tool (xla_images.abi as one zipapp) is copied to run inside the image.
TOOLS_DIR = "/tmp/xla-images-checks"


# --- fixtures --------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def flavour(target: CheckTarget) -> Target:
    return target.flavour


@pytest.fixture(scope="session")
def image_attrs(target: CheckTarget) -> dict[str, Any]:
    attrs = engine.images.image_inspect(target.image)
    if attrs is None:
        pytest.fail(f"image {target.image} is not on this engine")
    return attrs


@pytest.fixture(scope="session")
def labels(image_attrs: dict[str, Any]) -> dict[str, str]:
    return dict(image_attrs["Config"].get("Labels") or {})


@pytest.fixture(scope="session")
def image_env(image_attrs: dict[str, Any]) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in image_attrs["Config"].get("Env") or [])


@pytest.fixture(scope="session")
def container(target: CheckTarget) -> Iterator[str]:
    options = smoke_runner.run_options(target.flavour, target.tpu)
    with engine.containers.running_container(target.image, ["sleep", "infinity"], role="checks",
                                             options=options) as cid:
        yield cid


@pytest.fixture(scope="session")
def host(container: str) -> testinfra.host.Host:
    return testinfra.get_host(f"docker://{container}")


@pytest.fixture(scope="session")
def installed(host: testinfra.host.Host) -> dict[str, str | None]:
    """Installed distribution versions, read from metadata without importing anything heavy."""
    program = (
        "import importlib.metadata as m, json, sys\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        f"print(json.dumps({{name: version(name) for name in {list(PACKAGES)!r}}}))\n"
    )
    return json.loads(_python(host, program))


@pytest.fixture(scope="session")
def layer_scan(target: CheckTarget) -> LayerScan:
    if target.layer_scan is not None:
        return target.layer_scan.result()  # started before the checks, beside the smoke suite
    return checks.scan_image_layers(engine.images.save_image_stream(target.image), target.ca_bundle)


def _python(host: testinfra.host.Host, program: str) -> str:
    result = host.run(f"python -c {shlex.quote(program)}")
    assert result.rc == 0, f"python in the image failed (exit {result.rc}): {result.stderr.strip()[-800:]}"
    return result.stdout.strip()




# --- identity: labels and environment --------------------------------------------------------------------

def test_built_for_this_flavour(flavour: Target, labels: dict[str, str]) -> None:
    assert labels.get(FLAVOUR_ID_LABEL) == flavour.id, (
        f"label {FLAVOUR_ID_LABEL} is {labels.get(FLAVOUR_ID_LABEL)!r}, the current inputs give {flavour.id}; "
        f"rebuild with `build.py build {flavour.tag}`")


def test_labels(flavour: Target, labels: dict[str, str]) -> None:
    wrong = {key: (labels.get(key), value) for key, value in flavour.labels.items() if labels.get(key) != value}
    assert not wrong, "labels differ (image, flavour): " + ", ".join(f"{k}={v}" for k, v in wrong.items())


def test_environment(flavour: Target, image_env: dict[str, str]) -> None:
    wrong = {key: (image_env.get(key), value) for key, value in flavour.env.items() if image_env.get(key) != value}
    assert not wrong, "env differs (image, flavour): " + ", ".join(f"{k}={v}" for k, v in wrong.items())


# --- what is installed -----------------------------------------------------------------------------------

def test_python_version(flavour: Target, host: testinfra.host.Host) -> None:
    version = _python(host, "import sys; print('%d.%d' % sys.version_info[:2])")
    assert version == flavour.python


@pytest.mark.parametrize("package", PACKAGES)
def test_package_version(package: str, flavour: Target, installed: dict[str, str | None]) -> None:
    expected = flavour.pinned_versions.get(package)
    if expected is None:
        assert installed[package] is None, f"{package} {installed[package]} is installed but {flavour.tag} pins none"
    else:
        assert installed[package] == expected, f"{package} is {installed[package]}, the flavour pins {expected}"


def test_nightly_is_the_claimed_night(flavour: Target, labels: dict[str, str], host: testinfra.host.Host) -> None:
    """A nightly's imported torch/torch_xla are the night its tag and labels name (pytorch/xla#8475)."""
    if not flavour.is_nightly:
        pytest.skip("not a nightly flavour")
    found = nightly_check.Found(**json.loads(_python(host, nightly_check.PROBE).splitlines()[-1]))
    problems = nightly_check.mismatches(flavour, labels, found)
    assert not problems, "; ".join(problems)


def test_abi_label_matches_torch(flavour: Target, labels: dict[str, str], host: testinfra.host.Host) -> None:
    flag = _python(host, "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
    label = labels.get(f"{LABEL_PREFIX}.abi")
    assert label == flavour.abi.value, f"ABI label is {label!r}, the flavour is {flavour.abi.value}"
    assert int(flag) == flavour.abi.glibcxx_use_cxx11_abi, (
        f"torch._C._GLIBCXX_USE_CXX11_ABI is {bool(int(flag))} but the image is labelled {label}")


def test_import_torch_xla(flavour: Target, host: testinfra.host.Host) -> None:
    version = _python(host, "import torch_xla; print(torch_xla.__version__)")
    assert version.splitlines()[-1].split("+")[0] == flavour.torch_xla


def test_abi_compatible(flavour: Target, host: testinfra.host.Host, container: str,
                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every extension linking torch resolves its symbols with the image's own libraries (xla_images.abi, run
    inside the image)."""
    tool = write_zipapp(tmp_path_factory.mktemp("abi-tool") / "abi.pyz")
    engine.containers.put_into_container(container, TOOLS_DIR, {"abi.pyz": tool})
    site = _python(host, "import importlib.util, os; "
                         "print(os.path.dirname(os.path.dirname(importlib.util.find_spec('torch').origin)))")
    result = host.run(f"python {TOOLS_DIR}/abi.pyz check {shlex.quote(site)} --json")
    assert result.rc in (0, 1), f"abi check could not run (exit {result.rc}): {result.stderr.strip()[-800:]}"
    report = json.loads(result.stdout)
    assert report["torch_abi"] == flavour.abi.value, f"torch libraries use the {report['torch_abi']} ABI"
    assert report["verdict"] in abi.LOADS, report["summary"]


# --- derived images: the constraints and the in-image check --------------------------------------------------

def test_constraints_are_the_rendered_ones(target: CheckTarget, labels: dict[str, str], image_env: dict[str, str],
                                           host: testinfra.host.Host) -> None:
    """The image's constraints file is the one `render` wrote from the lock, its labels name it and its sha256,
    and PIP_CONSTRAINT / UV_CONSTRAINT point at it (docs/derived.md)."""
    assert labels.get(CONSTRAINTS_LABEL) == IMAGE_CONSTRAINTS, labels.get(CONSTRAINTS_LABEL)
    assert image_env.get("PIP_CONSTRAINT") == IMAGE_CONSTRAINTS == image_env.get("UV_CONSTRAINT")
    text = host.file(IMAGE_CONSTRAINTS).content_string
    assert constraints_digest(text) == labels.get(CONSTRAINTS_SHA256_LABEL), (
        f"{IMAGE_CONSTRAINTS} hashes to {constraints_digest(text)}, the label says "
        f"{labels.get(CONSTRAINTS_SHA256_LABEL)}")
    torch = target.flavour.pinned_versions["torch"]
    assert f"torch=={torch}" in text.splitlines(), f"{IMAGE_CONSTRAINTS} does not pin torch=={torch}"


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_xla_images_check_passes(as_json: bool, flavour: Target, host: testinfra.host.Host) -> None:
    """`xla-images-check`, on PATH, exits 0 in the image as built: what a derived image's CI runs last."""
    result = host.run(f"{CHECK_TOOL} --json" if as_json else CHECK_TOOL)
    assert result.rc == 0, f"{CHECK_TOOL} exited {result.rc}: {result.stdout.strip()[-1500:]} {result.stderr[-800:]}"
    if as_json:
        report = json.loads(result.stdout)
        # The tag the constraints file names: a devel image keeps its runtime flavour's pins, and says so.
        assert report["ok"] and report["tag"] == flavour.runtime_tag, report
        assert report["packages"]["torch"]["installed"] == flavour.pinned_versions["torch"], report["packages"]


def test_no_compiler(flavour: Target, host: testinfra.host.Host) -> None:
    if flavour.is_devel:
        pytest.skip("a devel image carries the compiler by design (test_devel_toolchain)")
    found = {name: host.check_output(f"command -v {name}") for name in COMPILERS if host.exists(name)}
    assert not found, f"compiler toolchain in the runtime image: {found}"


# --- devel images: the toolchain, the runtime's layers, an extension built here runs there -------------------

@pytest.fixture(scope="session")
def runtime_attrs(flavour: Target) -> dict[str, Any]:
    """The runtime image a devel image was built FROM (`xla-images:<runtime tag>`), which must be built too."""
    if not flavour.is_devel:
        pytest.skip("a runtime image")
    attrs = engine.images.image_inspect(local_ref(flavour.runtime_tag))
    if attrs is None:
        pytest.fail(f"{local_ref(flavour.runtime_tag)} is not built: a devel image is tested with its runtime image "
                    f"(`build.py build {flavour.runtime_tag}`)")
    return attrs


def test_devel_toolchain(flavour: Target, host: testinfra.host.Host) -> None:
    """g++, ninja and the python's headers are there: what torch.utils.cpp_extension builds with."""
    if not flavour.is_devel:
        pytest.skip("a runtime image")
    missing = [tool for tool in DEVEL_TOOLS if not host.exists(tool)]
    assert not missing, f"not on PATH in the devel image: {missing}"
    headers = _python(host, "import os, sysconfig; print(os.path.isfile(os.path.join("
                            "sysconfig.get_paths()['include'], 'Python.h')))")
    assert headers == "True", "the python headers (Python.h) are missing from the devel image"


def test_devel_keeps_runtime_layers(flavour: Target, image_attrs: dict[str, Any],
                                    runtime_attrs: dict[str, Any]) -> None:
    """The devel image is the runtime image's layers, unchanged and in order, and a few of its own on top."""
    runtime = list(runtime_attrs["RootFS"]["Layers"])
    devel = list(image_attrs["RootFS"]["Layers"])
    assert devel[:len(runtime)] == runtime, (
        f"{flavour.tag}'s first {len(runtime)} layers are not {flavour.runtime_tag}'s: rebuild both from the same "
        "inputs (`build.py build` of both tags)")
    assert 0 < len(devel) - len(runtime) <= MAX_DEVEL_LAYERS, f"{len(devel) - len(runtime)} devel layers"


def test_devel_extension_runs_in_runtime(flavour: Target, host: testinfra.host.Host, container: str,
                                         runtime_attrs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                                         target: CheckTarget) -> None:
    """examples/extension (a pybind11 function and a TORCH_LIBRARY op) builds with a plain `pip wheel .` here,
    and its wheel installs into the runtime image and runs there on the XLA device."""
    engine.containers.put_into_container(container, EXTENSION_DIR, {"src": resources.extension_example_dir()})
    built = host.run(f"cd {EXTENSION_DIR}/src && pip wheel --no-deps -w {EXTENSION_DIR}/dist .")
    assert built.rc == 0, f"`pip wheel .` of the example failed (exit {built.rc}): {built.stderr.strip()[-1500:]}"
    wheels = engine.containers.copy_from_container(container, f"{EXTENSION_DIR}/dist",
                                                   tmp_path_factory.mktemp("extension-wheel"))
    wheel = next(iter(sorted(wheels.glob("*.whl"))), None)
    assert wheel is not None, f"`pip wheel .` left no wheel: {built.stdout.strip()[-800:]}"
    options = smoke_runner.run_options(flavour, target.tpu)
    with engine.containers.running_container(str(runtime_attrs["Id"]), ["sleep", "infinity"], role="checks",
                                             options=options) as runtime_container:
        engine.containers.put_into_container(runtime_container, EXTENSION_DIR, {wheel.name: wheel})
        runtime = testinfra.get_host(f"docker://{runtime_container}")
        installed = runtime.run(f"pip install --no-deps --no-index {EXTENSION_DIR}/{wheel.name}")
        assert installed.rc == 0, f"the wheel does not install into {flavour.runtime_tag}: {installed.stderr[-800:]}"
        ran = runtime.run("python -m xla_ext.check")
        assert ran.rc == 0, (f"the extension built in {flavour.tag} fails in {flavour.runtime_tag} (exit {ran.rc}): "
                             f"{(ran.stdout + ran.stderr).strip()[-1500:]}")


# --- nothing from the build, nothing secret --------------------------------------------------------------

def test_no_site_ca_bundle_in_layers(target: CheckTarget, layer_scan: LayerScan) -> None:
    if target.ca_bundle is None:
        pytest.skip("this site injects no CA bundle into builds (ca_bundle: none, or auto found none)")
    assert layer_scan.layers > 0, "docker save gave no layers"
    found = layer_scan.of("ca-bundle")
    assert not found, f"the site CA bundle {target.ca_bundle} is in the image: " + "; ".join(map(str, found))


def test_no_build_pip_config(layer_scan: LayerScan, image_env: dict[str, str]) -> None:
    found = layer_scan.of("pip-config", "build-context")
    assert not found, "build configuration left in the image: " + "; ".join(map(str, found))
    leaked = sorted(key for key in ("PIP_CONFIG_FILE", "PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
                    if key in image_env)
    assert not leaked, f"pip build settings left in the image environment: {', '.join(leaked)}"


def test_no_credentials_in_layers(layer_scan: LayerScan) -> None:
    found = layer_scan.of("credentials-file", "url-credentials")
    assert not found, "credentials in image layers: " + "; ".join(map(str, found))


def test_no_credentials_in_metadata(target: CheckTarget, labels: dict[str, str],
                                    image_attrs: dict[str, Any]) -> None:
    history = engine.images.image_history(target.image)
    found = checks.scan_metadata(labels, list(image_attrs["Config"].get("Env") or []), history)
    assert not found, "credentials in labels, env or history: " + "; ".join(map(str, found))


# --- users: any UID, the image's user, the restricted profile (docs/running.md) -------------------------------

# Who runs the probe: (id, profile). 12345 has no passwd entry; 12345:12345 is outside group 0, so HOME and the
# caches move under /tmp; 1000 is the image's user; `restricted` adds a read-only root, a tmpfs /tmp, no
# capabilities, no-new-privileges and no network (model.running, the profile `build.py test` and `run-spec` use).
RUN_AS = {
    "uid-gid0": running.RunProfile("uid-gid0", user=f"{running.ARBITRARY_UID}:0"),
    "uid-own-group": running.RunProfile("uid-own-group", user=f"{running.ARBITRARY_UID}:{running.ARBITRARY_UID}"),
    "image-user": running.RunProfile("image-user", user=str(running.IMAGE_UID)),
    "restricted": running.restricted_profile(),
}
# Imports torch_xla, computes on the XLA device, writes into HOME and each cache, runs xla-images-check; one JSON
# line. getpass.getuser() is what torch's inductor cache asks (KeyError for a UID without a name, without the hook).
USER_PROBE = """
import getpass, json, os, subprocess, sys
import torch, torch_xla
import torch_xla.core.xla_model as xm
device = torch_xla.device() if hasattr(torch_xla, 'device') else xm.xla_device()
value = float((torch.ones(2, 2, device=device) * 3).sum().item())
written = {}
for name in ('HOME', 'XDG_CACHE_HOME', 'TORCHINDUCTOR_CACHE_DIR'):
    path = os.environ.get(name, '')
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, '.xla-images-probe'), 'w') as handle:
            handle.write('ok')
        written[name] = path
    except OSError as error:
        written[name] = 'unwritable: %s' % error
check = subprocess.run(['xla-images-check', '--json'], capture_output=True, text=True)
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'user': getpass.getuser(), 'value': value,
                  'written': written, 'check_rc': check.returncode, 'check': check.stdout[-2000:] + check.stderr[-800:]}))
"""
# Setuid/setgid files, world-writable paths, and what /tmp and HOME hold, in a fresh container: one JSON line.
# Only the root filesystem (the image's layers): /proc, /sys, /dev and the engine's mounts are other devices.
FILESYSTEM_PROBE = """
import json, os, stat, sys
home = sys.argv[1]
root_dev = os.lstat('/').st_dev
setid, world = [], []
for top, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == root_dev]
    for name in dirs + files:
        path = os.path.join(top, name)
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            continue
        if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
            setid.append(path)
        if mode & stat.S_IWOTH:
            world.append([path, bool(mode & stat.S_ISVTX) and stat.S_ISDIR(mode)])
stray = {where: sorted(os.listdir(where)) if os.path.isdir(where) else None for where in ('/tmp', home)}
print(json.dumps({'setid': setid, 'world': world, 'stray': stray}))
"""
# World-writable directories allowed: the FHS temporary and lock directories, each with the sticky bit.
TEMP_DIRS = ("/tmp", "/var/tmp", "/run/lock")


def _probe_json(output: str) -> dict[str, Any]:
    lines = [line for line in output.strip().splitlines() if line.startswith("{")]
    assert lines, f"the probe printed no result: {output.strip()[-1500:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def filesystem(target: CheckTarget) -> dict[str, Any]:
    outcome = engine.containers.run_container(target.image, ["python", "-c", FILESYSTEM_PROBE,
                                                             running.HOME_ENV["HOME"]], role="checks", timeout=600)
    assert outcome.exit_code == 0, f"the filesystem probe failed (exit {outcome.exit_code}): {outcome.output[-1500:]}"
    return _probe_json(outcome.output)


def test_no_setuid_or_setgid_files(filesystem: dict[str, Any]) -> None:
    assert not filesystem["setid"], f"setuid/setgid files in the image: {filesystem['setid'][:20]}"


def test_nothing_world_writable(filesystem: dict[str, Any]) -> None:
    found = [path for path, sticky_dir in filesystem["world"] if not (path in TEMP_DIRS and sticky_dir)]
    assert not found, f"world-writable outside {', '.join(TEMP_DIRS)} (sticky): {found[:20]}"


def test_no_stray_files_in_tmp_or_home(filesystem: dict[str, Any]) -> None:
    stray = {where: entries for where, entries in filesystem["stray"].items() if entries}
    assert not stray, f"the image leaves files behind: {stray}"
    assert filesystem["stray"][running.HOME_ENV["HOME"]] is not None, f"{running.HOME_ENV['HOME']} is missing"


def test_image_user(image_attrs: dict[str, Any], image_env: dict[str, str], host: testinfra.host.Host) -> None:
    """The image's user exists (UID 1000, group 0, its HOME), its home is root-owned and group-0 writable, and HOME and the
    caches are the documented ones."""
    user = host.user(running.IMAGE_USER)
    assert user.exists and (user.uid, user.gid, user.home) == (running.IMAGE_UID, running.IMAGE_GID,
                                                               running.HOME_ENV["HOME"]), (user.uid, user.gid)
    home = host.file(running.HOME_ENV["HOME"])
    # Owned by root (root's pip refuses, with a warning on every run, a cache under a home root does not own),
    # group 0 writable for the image's user and any UID run with GID 0.
    assert home.is_directory and home.uid == 0 and home.gid == 0 and home.mode & 0o070 == 0o070, (
        home.uid, home.gid, oct(home.mode))
    wrong = {key: image_env.get(key) for key, value in running.HOME_ENV.items() if image_env.get(key) != value}
    assert not wrong, f"HOME/cache environment differs from model.running.HOME_ENV: {wrong}"


@pytest.mark.parametrize("who", list(RUN_AS))
def test_runs_as(who: str, target: CheckTarget) -> None:
    """torch_xla imports and computes on XLA, HOME and the caches are writable, xla-images-check passes."""
    profile = RUN_AS[who]
    options = smoke_runner.options_for(dataclasses.replace(
        profile, environment={"PJRT_DEVICE": "CPU", **profile.environment}))
    outcome = engine.containers.run_container(target.image, ["python", "-c", USER_PROBE], role="checks",
                                              options=options, timeout=900)
    assert outcome.exit_code == 0, f"as {profile.user} (exit {outcome.exit_code}): {outcome.output.strip()[-2000:]}"
    found = _probe_json(outcome.output)
    assert found["value"] == 12.0, found
    assert found["uid"] == profile.uid, found
    unwritable = {name: path for name, path in found["written"].items() if path.startswith("unwritable")}
    assert not unwritable, f"as {profile.user}: {unwritable}"
    assert found["check_rc"] == 0, f"xla-images-check as {profile.user}: {found['check']}"
