"""Bootstrapped base images (`build.py base`): what they contain, when they are made, what is refused."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.errors import ConfigError
from xla_images.run.building import base
from xla_images.run import engine

REPO = Path(__file__).resolve().parents[2]


def test_base_has_labels_python_venv_and_shared_libpython(bootstrapped_base: base.BaseImage) -> None:
    labels = engine.images.image_labels(bootstrapped_base.ref)
    assert labels == {base.PYTHON_LABEL: "3.11", base.SUITE_LABEL: "bookworm"}
    script = ("python3.11 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(sys.prefix)' && "
              "python3.11 -c 'import ctypes; ctypes.CDLL(\"libpython3.11.so.1.0\"); print(\"shared ok\")' && "
              "echo LANG=$LANG && if command -v gcc cc c++; then echo compiler; fi")
    run = engine.containers.run_container(bootstrapped_base.ref, ["sh", "-c", script], role="test")
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    assert lines[:3] == ["/tmp/venv", "shared ok", "LANG=C.UTF-8"]
    assert "compiler" not in run.output
    # apt's lists and downloaded packages were dropped from the rootfs
    run = engine.containers.run_container(bootstrapped_base.ref,
                                          ["sh", "-c", "ls /var/lib/apt/lists /var/cache/apt/archives"],
                               role="test")
    assert ".deb" not in run.output and "_Packages" not in run.output


def test_trixie_base_has_python_3_13_venv_and_shared_libpython() -> None:
    """The second base `ci/setup.sh --bases all` bootstraps here (~40 s when missing; kept, as the 3.11 one is):
    Debian 13 from the same mirror, with the same contents for python 3.13."""
    made = base.ensure_base("3.13", say=lambda line: print(line, file=sys.stderr))
    assert engine.images.image_labels(made.ref) == {base.PYTHON_LABEL: "3.13", base.SUITE_LABEL: "trixie"}
    script = ("python3.13 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import ssl, sys; print(sys.version[:4])' && "
              "python3.13 -c 'import ctypes; ctypes.CDLL(\"libpython3.13.so.1.0\"); print(\"shared ok\")' && "
              "cut -d. -f1 /etc/debian_version")
    run = engine.containers.run_container(made.ref, ["sh", "-c", script], role="test")
    assert run.exit_code == 0, run.output
    assert run.output.splitlines()[:3] == ["3.13", "shared ok", "13"]


def test_existing_base_is_reused_unless_forced(bootstrapped_base: base.BaseImage) -> None:
    again = base.ensure_base("3.11", say=lambda line: None)
    assert again.reused
    assert again.image_id == bootstrapped_base.image_id


@pytest.mark.parametrize("python", ["3.9", "3.10", "3.12"])
def test_pythons_without_a_debian_suite_are_refused_with_the_reason(python: str) -> None:
    with pytest.raises(ConfigError) as raised:
        base.suite_for(python)
    assert raised.value.rule == "base-python"
    assert "bases" in raised.value.hint and "bookworm has 3.11" in raised.value.hint


def test_a_suite_that_does_not_ship_the_python_is_refused() -> None:
    with pytest.raises(ConfigError) as raised:
        base.suite_for("3.11", "trixie")
    assert "--suite bookworm" in raised.value.hint
    assert base.suite_for("3.13") == "trixie"


def test_cli_base_refuses_an_unbuildable_python_before_any_work() -> None:
    result = subprocess.run([sys.executable, str(REPO / "build.py"), "base", "--python", "3.12"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "cannot bootstrap a base for python 3.12" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_scratch_rootfs_is_unmounted_before_it_is_deleted(tmp_path: Path) -> None:
    """An interrupted debootstrap can leave /proc-like mounts in the rootfs; deleting through them would
    reach the mounted filesystem. The clean-up unmounts first."""
    workdir = tmp_path / "base-scratch"
    mounted = workdir / "rootfs" / "proc"
    mounted.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mounted)], check=True)
    (mounted / "inside-the-mount").write_text("x")
    try:
        base._remove_tree(workdir)
    finally:
        if base._mounts_below(workdir):
            subprocess.run(["umount", "--lazy", str(mounted)], check=False)
    assert not workdir.exists()
    assert not base._mounts_below(tmp_path)
