"""Publishing against the real engine and real registry processes (registry_process: ci/registry.sh on free ports).

The images are small (FROM scratch, random data, the flavour-id label) and belong to a throw-away matrix with
a release no real matrix has, so nothing here touches real flavours' images or the suite registry.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from faultproxy import FaultProxy
from publish_support import PASSWORD, Project, build_image, make_project, registry_named_images
from registry_process import REPO, RegistryProcess, free_port, running
from xla_images import names
from xla_images.run import engine
from xla_images.run import registry as registries


# --- fixtures --------------------------------------------------------------------------------------------

@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryProcess]:
    with running(tmp_path / "state") as process:  # any free port: this suite needs no fixed range
        yield process


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    created = make_project(tmp_path / "project")
    yield created
    engine.images.remove_image(names.local_ref(created.flavour.tag), force=True)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text


# --- tests -----------------------------------------------------------------------------------------------

def test_registry_down_is_a_clear_failure_and_changes_nothing(project: Project, tmp_path: Path) -> None:
    build_image(tmp_path / "ctx", project.flavour, (1,))
    project.published.write_text('{"schema": 1, "flavours": {}}\n', encoding="utf-8")
    before = project.published.read_bytes()
    host = f"127.0.0.1:{free_port()}"  # nothing listens there

    result = project.cli("push", project.flavour.tag, "--registry", f"{host}/xla-images")

    assert result.returncode == 1, result.stderr
    assert f"registry {host} does not answer" in result.stderr
    assert "ci/registry.sh start" in result.stderr
    assert "Traceback" not in result.stderr
    assert project.published.read_bytes() == before
    assert registry_named_images(host) == []
    assert_no_secret(result.stdout, result.stderr)


def test_push_verifies_every_tag_then_resolve_and_pull_by_digest(project: Project, registry: RegistryProcess,
                                                                  tmp_path: Path) -> None:
    image_id = build_image(tmp_path / "ctx", project.flavour, (2, 1))
    target = f"{registry.host}/xla-images"

    pushed = project.cli("push", project.flavour.tag, "--registry", target)

    assert pushed.returncode == 0, pushed.stderr
    entry = json.loads(project.published.read_text())["flavours"][project.flavour.tag]
    digest = entry["digest"]
    assert entry["ref"] == f"{target}@{digest}" and entry["tags"] == list(project.flavour.tags)
    assert entry["flavour"]["id"] == project.flavour.id
    assert entry["labels"][names.FLAVOUR_ID_LABEL] == project.flavour.id
    for tag in project.flavour.tags:  # the tag and both aliases, as the registry itself answers
        assert registry.digest("xla-images", tag) == digest
    assert registry_named_images(registry.host) == []  # the push's temporary local names are gone
    assert_no_secret(pushed.stdout, pushed.stderr, project.published.read_text())

    resolved = project.cli("resolve", "--abi", "cxx11", "--python", "3.11")
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.strip() == f"{target}@{digest}"

    engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)
    assert engine.images.image_inspect(image_id) is None
    pulled = project.cli("pull", "--python", "3.11")
    try:
        assert pulled.returncode == 0, pulled.stderr
        assert pulled.stdout.strip() == f"{target}@{digest}"
        attrs = engine.images.image_inspect(f"{target}@{digest}")
        assert attrs is not None and attrs["Id"] == image_id  # the very image that was built
        assert_no_secret(pulled.stdout, pulled.stderr)
    finally:
        engine.images.remove_image(f"{target}@{digest}", force=True)


def test_registry_killed_mid_push_leaves_no_tag_then_a_second_push_completes(
        project: Project, registry: RegistryProcess, tmp_path: Path) -> None:
    build_image(tmp_path / "ctx", project.flavour, (70, 70, 70))
    # The first push goes through a proxy of the test's own, which counts what reaches the registry: the test
    # reads only what it owns (the registry's upload scratch files come and go under a reader's feet).
    proxy = FaultProxy(upstream=("127.0.0.1", registry.port), port=free_port(), lifetime=600).start()
    target = f"{proxy.address}/xla-images"
    project.published.write_text('{"schema": 1, "flavours": {}}\n', encoding="utf-8")
    before = project.published.read_bytes()

    env = {**os.environ, "CI": "true", registries.USER_ENV: "ci-bot", registries.PASSWORD_ENV: PASSWORD}
    command = [sys.executable, str(REPO / "build.py"), "push", project.flavour.tag, "--registry", target,
               "--matrix", str(project.root / "matrix.yaml"), "--site", str(project.root / "site.yaml")]
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Crash the registry once layer data is arriving, well before all 210 MB of it could have.
        deadline = time.monotonic() + 120
        while proxy.forwarded < (30 << 20):
            assert first.poll() is None, f"push ended before it could be interrupted: {first.communicate()}"
            assert time.monotonic() < deadline, "no layer data reached the registry"
            time.sleep(0.05)
        registry.crash()
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
        proxy.stop()

    assert first.returncode == 1, err
    assert "push of" in err and proxy.address in err and "Traceback" not in err
    assert project.published.read_bytes() == before
    assert registry_named_images(proxy.address) == []
    assert_no_secret(out, err)

    registry.start()
    assert registry.tags("xla-images") == []  # no tag, and so no alias, names a manifest that is not there

    second = project.cli("push", project.flavour.tag, "--registry", f"{registry.host}/xla-images")

    assert second.returncode == 0, second.stderr
    digest = json.loads(project.published.read_text())["flavours"][project.flavour.tag]["digest"]
    assert {tag: registry.digest("xla-images", tag) for tag in project.flavour.tags} == \
        {tag: digest for tag in project.flavour.tags}
    assert_no_secret(second.stdout, second.stderr, project.published.read_text())


def test_wrong_image_is_refused_before_anything_is_pushed(project: Project, registry: RegistryProcess,
                                                          tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "x").write_text("x")
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY x /x\nLABEL {names.FLAVOUR_ID_LABEL}=sha256:{'0' * 64}\n")
    engine.classic.build_directory(context, names.local_ref(project.flavour.tag))

    result = project.cli("push", project.flavour.tag, "--registry", f"{registry.host}/xla-images")

    assert result.returncode == 1
    assert "built from other inputs" in result.stderr and "build.py build" in result.stderr
    assert registry.tags("xla-images") == [] and not project.published.exists()
