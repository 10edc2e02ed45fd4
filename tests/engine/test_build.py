"""`build` against the real engine, with throw-away projects whose wheels are tiny local ones.

What is under test is the orchestration and the real Dockerfile: tags and labels, the skip of an up-to-date
flavour, --keep-going, interrupts, what is left behind, the CA staying out of the image, layer sharing.
The real torch_xla flavour is built by the end-to-end test (test_e2e*.py).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from publish_support import build_image
from reporters import QuietReporter
from save_scan import scan
from xla_images import names, resources
from xla_images.generate.plan import BUILD_SCRIPTS
from xla_images.model.compression import LAYER_MEDIA_TYPES
from xla_images.run.building import build, context as build_context
from xla_images.run import engine
from xla_images.run.building.build import BuildOptions, Outcome

OLD, NEW = "8.71.0", "8.72.0"
GZIP_LAYER = LAYER_MEDIA_TYPES["gzip"][0]  # what BuildKit stores a gzip export as


@pytest.fixture(scope="module")
def built(make_project):
    """Two flavours of python 3.11 built once, two at a time, for the tests that only look at them."""
    project = make_project(OLD, NEW)
    plan = project.plan()
    results = build.build_flavours(plan, list(plan.flavours), BuildOptions(jobs=2), QuietReporter())
    assert [result.outcome for result in results] == [Outcome.BUILT, Outcome.BUILT], [r.message for r in results]
    return project


def test_build_tags_flavour_and_aliases_with_labels(built) -> None:
    plan = built.plan()
    for flavour in plan.flavours:
        attrs = engine.images.image_inspect(names.local_ref(flavour.tag))
        assert attrs is not None, f"{names.local_ref(flavour.tag)} was not tagged"
        labels = attrs["Config"]["Labels"]
        assert labels[names.FLAVOUR_ID_LABEL] == flavour.id
        assert labels["io.xla-images.tag"] == flavour.tag
        assert labels["org.opencontainers.image.base.name"].startswith("xla-images-test/base:3.11-")
        assert f"XLA_IMAGES_TORCH_XLA={flavour.torch_xla}" in attrs["Config"]["Env"]
        assert flavour.aliases, "the test matrix gives each flavour a minor alias"
        for alias in flavour.aliases:
            assert engine.images.image_inspect(names.local_ref(alias))["Id"] == attrs["Id"]
        log = plan.root / "reports" / flavour.tag / "build.log"
        text = log.read_text()
        assert f"image {attrs['Id']}" in text and f"id {flavour.id}" in text


def test_image_holds_the_locked_wheels(built) -> None:
    flavour = built.flavour(NEW)
    probe = "import torch, torch_xla; print(torch.__version__, torch.MARKER)"
    run = engine.containers.run_container(names.local_ref(flavour.tag), ["python", "-c", probe], role="test")
    assert run.exit_code == 0, run.output
    assert run.output.split() == [NEW, f"{built.wheel_marker}-torch-{NEW}"]


def test_up_to_date_flavour_is_skipped(built, reporter, capsys) -> None:
    plan = built.plan()
    before = {flavour.tag: built.image_id(flavour.torch_xla) for flavour in plan.flavours}
    started = time.monotonic()
    results = build.build_flavours(plan, list(plan.flavours), BuildOptions(), reporter)
    seconds = time.monotonic() - started
    with capsys.disabled():
        print(f"\nno-op rebuild of {len(results)} flavours: {seconds:.2f} s")
    assert [result.outcome for result in results] == [Outcome.SKIPPED, Outcome.SKIPPED]
    assert {result.flavour.tag: result.image_id for result in results} == before
    started = time.monotonic()
    cli = built.cli("build")
    seconds = time.monotonic() - started
    with capsys.disabled():
        print(f"no-op `build.py build` (process start, plan, engine checks): {seconds:.2f} s")
    assert cli.returncode == 0, cli.stderr
    assert [line.split("] ")[1].split(" (")[0] for line in cli.stderr.splitlines() if line.startswith("[")] == [
        "up to date", "up to date"], cli.stderr
    assert {flavour.tag: built.image_id(flavour.torch_xla) for flavour in plan.flavours} == before


def test_changed_input_is_rebuilt_and_force_rebuilds(built, reporter, no_leaked_containers, monkeypatch,
                                                     tmp_path: Path) -> None:
    flavour = built.flavour(OLD)
    before = built.image_id(OLD)
    results = build.build_flavours(built.plan(), [flavour], BuildOptions(force=True), reporter)
    assert results[0].outcome is Outcome.BUILT
    # The smoke suite (shipped with xla-images) is an input of the id: a changed one makes the image out of date.
    suite = tmp_path / "xla_smoke"
    shutil.copytree(resources.smoke_dir(), suite, ignore=shutil.ignore_patterns("__pycache__"))
    (suite / "extra_for_test.py").write_text("# changed\n")
    monkeypatch.setattr(resources, "smoke_dir", lambda: suite)
    changed = built.flavour(OLD)
    assert changed.id != flavour.id
    results = build.build_flavours(built.plan(), [changed], BuildOptions(), reporter)
    assert results[0].outcome is Outcome.BUILT
    assert built.image_id(OLD) != before
    assert engine.images.image_labels(names.local_ref(changed.tag))[names.FLAVOUR_ID_LABEL] == changed.id


@pytest.mark.skipif(engine.connection.image_store() != "containerd", reason="the classic store keeps layers "
                    "uncompressed, and the push compresses them as the site says")
def test_an_image_stored_in_another_compression_is_built_again(built, reporter, tmp_path: Path) -> None:
    """As if pulled from a gzip registry: the flavour's id, gzip layers. The skip would leave the push to fail
    `push-compression`; the build says so and exports the layers again, as the site says."""
    plan = built.plan()
    flavour = built.flavour(NEW)
    build_image(tmp_path / "gzip", flavour, (1,), compression="gzip")
    assert engine.stored.layer_media_types(names.local_ref(flavour.tag)) == [GZIP_LAYER]

    results = build.build_flavours(plan, [flavour], BuildOptions(), reporter)

    assert results[0].outcome is Outcome.BUILT, results[0].message
    assert any(f"stored as {GZIP_LAYER}, not the site's {plan.site.compression.describe()}: building it again" in text
               for text in reporter.notices), reporter.notices
    wanted = LAYER_MEDIA_TYPES[plan.site.compression.format]
    assert set(engine.stored.layer_media_types(names.local_ref(flavour.tag))) <= set(wanted)
    again = build.build_flavours(plan, [flavour], BuildOptions(), reporter)
    assert again[0].outcome is Outcome.SKIPPED


def test_ca_bundle_is_in_no_layer_of_the_image(built) -> None:
    flavour = built.flavour(NEW)
    ca = built.ca_marker.encode()
    wheel = built.wheel_marker.encode()
    found = scan(engine.images.save_image_stream(names.local_ref(flavour.tag)), [ca, wheel])
    # Control: the scan does read the layers (the venv's torch carries the wheel marker).
    assert found[wheel], "layer scan did not find the wheel marker: the scan is broken"
    assert not found[ca], "the CA bundle's bytes are in a layer of the runtime image"


def test_flavours_of_one_python_share_the_base_stage_layers(built, test_base: str) -> None:
    old, new = (engine.images.image_layers(names.local_ref(built.flavour(version).tag)) for version in (OLD, NEW))
    base_layers = engine.images.image_layers(test_base)
    # The base image's layers, the base stage's three (the bare venv, the user database and the de-setuid'd
    # programs, the image user's home) and the venv's bootstrap (pip, setuptools: neither lock pins them) are one
    # set of layers, stored once.
    shared = len(base_layers) + 4
    assert old[:len(base_layers)] == base_layers
    assert old[:shared] == new[:shared]
    assert old[shared] != new[shared], "the wheel layers should differ: the flavours install other wheels"


def test_context_holds_what_the_dockerfile_expects_and_ca_bundle_option_wins(make_project, tmp_path: Path) -> None:
    project = make_project("8.81.0")
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nOTHER\n-----END CERTIFICATE-----\n")
    plan = build.with_ca_bundle(project.plan(), other_ca)
    flavour = plan.flavours[0]
    context = tmp_path / "context"
    context.mkdir()
    build_context.write_context(plan, flavour, context)
    assert (context / "Dockerfile").read_text() == plan.rendered[flavour.tag]["Dockerfile"]
    assert (context / "requirements.lock").read_text() == plan.lock_path(flavour).read_text()
    # The pip settings and the CA are BuildKit secrets: beside the context, never inside it.
    secrets = build_context.secrets_dir_for(context)
    assert not (context / "pip").exists()
    assert (secrets / "ca.crt").read_bytes() == other_ca.read_bytes()
    assert build_context.context_secrets(context) == {"ca.crt": secrets / "ca.crt", "pip.conf": secrets / "pip.conf"}
    for name, source in BUILD_SCRIPTS.items():
        assert (context / name).read_bytes() == source.read_bytes()
    conf = (secrets / "pip.conf").read_text()
    assert "cert = /tmp/pip/ca.crt" in conf and "no-index = true" in conf
    assert sorted(path.name for path in (context / "wheelhouse").iterdir()) == [
        "torch-8.81.0-py3-none-any.whl", "torch_xla-8.81.0-py3-none-any.whl"]
    assert (context / "xla_smoke" / "__main__.py").is_file()
    assert not list(context.rglob("__pycache__"))
    plan = project.plan()
    plan = dataclasses.replace(plan, site=dataclasses.replace(plan.site, ca_bundle_setting="none"))
    plain = tmp_path / "plain"
    plain.mkdir()
    build_context.write_context(plan, flavour, plain)
    # Without a CA there is no ca.crt secret at all (the mount is skipped), and pip is not told about one.
    assert build_context.context_secrets(plain) == {"pip.conf": build_context.secrets_dir_for(plain) / "pip.conf"}
    assert "cert" not in (build_context.secrets_dir_for(plain) / "pip.conf").read_text()


def test_missing_lock_fails_naming_the_lock_command(make_project, reporter, no_leaked_containers) -> None:
    project = make_project("8.73.0")
    flavour = project.flavour("8.73.0")
    project.plan().lock_path(flavour).unlink()
    results = build.build_flavours(project.plan(), [project.flavour("8.73.0")], BuildOptions(), reporter)
    assert results[0].outcome is Outcome.FAILED
    assert "no lock" in results[0].message
    assert f"./build.py lock {flavour.tag}" in results[0].log.read_text()
    assert project.image_id("8.73.0") is None


def test_base_without_python_fails_with_the_dockerfiles_message(make_project, test_base, session_id, reporter,
                                                                dangling_images, no_leaked_containers,
                                                                tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {test_base}\nRUN rm /usr/bin/python3.11\n")
    no_python = f"xla-images-test/no-python:{session_id}"
    engine.classic.build_directory(tmp_path, no_python)
    project = make_project("8.80.0")
    project.use_base(no_python)
    results = build.build_flavours(project.plan(), project.flavours(), BuildOptions(), reporter)
    assert results[0].outcome is Outcome.FAILED
    assert results[0].base_image == no_python
    assert "the base image has no python3.11 on PATH" in results[0].log.read_text()
    assert project.image_id("8.80.0") is None
    assert not dangling_images()


def test_keep_going_builds_the_others_and_exits_1(make_project, dangling_images, no_leaked_containers) -> None:
    project = make_project("8.74.0", "8.75.0")
    project.break_lock("8.74.0")
    bad, good = project.flavour("8.74.0"), project.flavour("8.75.0")
    result = project.cli("build", "--keep-going", bad.tag, good.tag)
    assert result.returncode == 1, result.stderr
    assert project.image_id("8.74.0") is None
    assert project.image_id("8.75.0") is not None
    summary = [line for line in result.stderr.splitlines() if line.startswith(("r8.74.0", "r8.75.0"))]
    assert any(line.startswith(bad.tag) and "failed" in line for line in summary), result.stderr
    assert any(line.startswith(good.tag) and "built" in line for line in summary), result.stderr
    assert "1 of 2 flavour(s) failed" in result.stderr
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in (project.root / "reports" / bad.tag / "build.log").read_text()
    assert not dangling_images()


def test_without_keep_going_no_build_starts_after_a_failure(make_project, dangling_images,
                                                           no_leaked_containers) -> None:
    project = make_project("8.76.0", "8.77.0")
    project.break_lock("8.76.0")
    bad, other = project.flavour("8.76.0"), project.flavour("8.77.0")
    result = project.cli("build", bad.tag, other.tag)
    assert result.returncode == 1
    assert project.image_id("8.76.0") is None and project.image_id("8.77.0") is None
    assert any(line.startswith(other.tag) and "not started" in line for line in result.stderr.splitlines())
    assert not dangling_images()


@pytest.mark.usefixtures("ctrl_c_raises")  # the child starts with SIGINT at its default
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupted_build_tags_nothing_and_leaves_nothing(make_project, dangling_images, no_leaked_containers,
                                                           signum: int) -> None:
    version = "8.78.0" if signum == signal.SIGTERM else "8.79.0"
    project = make_project(version)
    flavour = project.flavour(version)
    assert project.cli("build", flavour.tag).returncode == 0
    good = project.image_id(version)
    # A new torch wheel with a large payload: a new flavour id, and a pip step slow enough to interrupt.
    project.write_wheels(version, payload=os.urandom(400 << 20))
    changed = project.flavour(version)
    assert changed.id != flavour.id
    log = project.root / "reports" / flavour.tag / "build.log"
    log.unlink()
    process = project.popen("build", changed.tag)
    try:
        _wait_for_step(log, "install_wheels.py", process)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted: stopping 1 build(s)" in stderr
    assert "Traceback" not in stderr
    # The earlier good image keeps the tag; the interrupted build tagged nothing.
    assert project.image_id(version) == good
    assert engine.images.image_labels(names.local_ref(changed.tag))[names.FLAVOUR_ID_LABEL] == flavour.id
    assert not dangling_images()
    # The build context (a temp dir with the wheels) goes with the interrupted build too.
    assert not list(Path(tempfile.gettempdir()).glob(f"xla-images-context-{changed.tag}-*"))


def _wait_for_step(log: Path, words: str, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until the build runs the step containing `words` (its container started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"build ended before the step: {process.communicate()}"
        if log.is_file():
            lines = log.read_text().splitlines()
            # Classic builder: "Step N/M : RUN ..." then " ---> Running in <container>".
            step = next((index for index, line in enumerate(lines) if line.startswith("Step ") and words in line),
                        None)
            if step is not None and any(line.startswith(" ---> Running in") for line in lines[step + 1:]):
                return
            # BuildKit: "#N [stage i/n] RUN ..." then the step's own output lines "#N <seconds> ...".
            step = next((index for index, line in enumerate(lines) if "] RUN " in line and words in line), None)
            if step is not None:
                prefix = lines[step].split(" ", 1)[0] + " "
                if any(line.startswith(prefix) and line[len(prefix):][:1].isdigit() for line in lines[step + 1:]):
                    return
        time.sleep(0.05)
    raise AssertionError(f"the build never reached {words!r}")
