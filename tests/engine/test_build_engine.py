"""run.engine's build-side functions against the real engine: copying out of images, no engine, leftovers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.errors import Failure
from xla_images.run import engine

REPO = Path(__file__).resolve().parents[2]


def _extract_containers() -> set[str]:
    return set(engine.containers.containers_created_by("extract"))


def test_extract_a_file_a_directory_and_a_symlink(bootstrapped_base, tmp_path: Path) -> None:
    before = _extract_containers()
    copied = engine.containers.extract_from_image(bootstrapped_base.ref, "/etc/debian_version", tmp_path / "file")
    assert copied == tmp_path / "file" / "debian_version"
    assert copied.read_text().startswith("12.")
    folder = engine.containers.extract_from_image(bootstrapped_base.ref, "/etc/apt/", tmp_path / "dir")
    assert folder == tmp_path / "dir" / "apt" and (folder / "sources.list.d").is_dir()
    # /etc/os-release is a symlink to ../usr/lib/os-release: the target's content lands under the link's name.
    linked = engine.containers.extract_from_image(bootstrapped_base.ref, "/etc/os-release", tmp_path / "link")
    assert not linked.is_symlink() and "bookworm" in linked.read_text()
    assert _extract_containers() == before


def test_extract_failures_are_failures_and_remove_the_container(bootstrapped_base, tmp_path: Path) -> None:
    before = _extract_containers()
    with pytest.raises(Failure) as missing_path:
        engine.containers.extract_from_image(bootstrapped_base.ref, "/no/such/file", tmp_path)
    assert missing_path.value.rule == "image-path-exists"
    with pytest.raises(Failure) as missing_image:
        engine.containers.extract_from_image("xla-images-test/no-such-image:0", "/etc", tmp_path)
    assert missing_image.value.rule == "image-exists"
    assert _extract_containers() == before


def test_symlinks_pointing_out_of_the_copy_are_skipped(bootstrapped_base, tmp_path: Path) -> None:
    # /etc/alternatives holds absolute symlinks to /usr/bin/...: never created as links out of dest.
    folder = engine.containers.extract_from_image(bootstrapped_base.ref, "/etc/alternatives", tmp_path)
    for path in folder.rglob("*"):
        if path.is_symlink():
            assert path.resolve().is_relative_to(tmp_path.resolve()), path


def test_no_engine_is_a_failure_naming_the_start_script(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", "from xla_images.run import engine; engine.connection.client()"],
                            env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no Docker engine answers" in result.stderr and "ci/engine.sh start" in result.stderr
    result = subprocess.run([sys.executable, str(REPO / "build.py"), "build", "r2.9.0_3.11_cpu"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "ci/engine.sh start" in result.stderr and "Traceback" not in result.stderr
