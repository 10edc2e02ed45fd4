"""Ctrl-C anywhere: exit 130, one line, nothing half-written, no temporary file left (issue 19).

Deterministic: the SIGINT is a real signal, sent by the process to itself at a chosen point (the n-th write of
`render`, the import of a chosen module during start-up), not at a chosen time. Python's own SIGINT handler is
put in place first (the `ctrl_c_raises` fixture): a shell starts background jobs (CI steps among them) with SIGINT
ignored.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fs_shapes import Checkout, copy_checkout, leftovers, snapshot
from hostile_inputs import ROOT, run_cli
from xla_images import diskio

STALE = "# stale\n"
STOPPED = ("interrupted", "aborted")  # the CLI's words for Ctrl-C (click says aborted inside a command)


pytestmark = pytest.mark.usefixtures("ctrl_c_raises")  # tests/conftest.py: SIGINT raises, however started


@pytest.fixture
def stale_checkout(pristine: Checkout, tmp_path: Path) -> Iterator[Checkout]:
    """A checkout (a copy of the module's pristine one, tests/unit/conftest.py) whose every Dockerfile render
    must rewrite."""
    checkout = copy_checkout(pristine, tmp_path, outside=False)
    for dockerfile in (checkout.root / "Dockerfiles").glob("*/Dockerfile"):
        dockerfile.write_text(dockerfile.read_text() + STALE)
    yield checkout


def interrupt_at_write(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """SIGINT to this process while the n-th temporary file is being created (signals are held then)."""
    real = diskio._create_exclusive
    calls = []

    def create(path: Path, what: str) -> tuple[int, str]:
        calls.append(path)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGINT)
        return real(path, what)

    monkeypatch.setattr(diskio, "_create_exclusive", create)


@pytest.mark.parametrize("at", ["first", "second", "middle", "last"])
def test_render_interrupted_at_any_write_leaves_whole_files_and_renders_clean_again(
        stale_checkout: Checkout, pristine: Checkout, monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    matrix = str(stale_checkout.matrix)
    # Every Dockerfile is stale, so render writes each once: the positions are counted in the matrix at hand.
    writes = len(list((stale_checkout.root / "Dockerfiles").glob("*/Dockerfile")))
    n = {"first": 1, "second": 2, "middle": writes // 2, "last": writes}[at]
    interrupt_at_write(monkeypatch, n)
    outcome = run_cli("render", "--matrix", matrix)
    monkeypatch.undo()
    assert outcome.code == 130, outcome.err
    assert outcome.err.strip() in STOPPED, outcome.err
    assert not leftovers(stale_checkout.root)
    dockerfiles = sorted((stale_checkout.root / "Dockerfiles").glob("*/Dockerfile"))
    new = [path for path in dockerfiles
           if path.read_text() == (pristine.root / path.relative_to(stale_checkout.root)).read_text()]
    stale = [path for path in dockerfiles if path.read_text().endswith(STALE)]
    assert len(new) + len(stale) == len(dockerfiles), "a Dockerfile is neither the old one nor the new one"
    assert len(new) == n, "the write under way when Ctrl-C came is finished, and no other begun"
    assert run_cli("render", "--matrix", matrix).code == 0
    check = run_cli("render", "--check", "--matrix", matrix)
    assert check.code == 0, check.err
    assert snapshot(stale_checkout.root) == snapshot(pristine.root)  # `git status` clean


def test_an_interrupted_orphan_removal_leaves_no_half_tree(pristine: Checkout, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_checkout(pristine, tmp_path, outside=False).root
    orphan = root / "Dockerfiles" / "r0.0.1_3.11_cpu"
    shutil.copytree(root / "Dockerfiles" / "r2.9.0_3.11_cpu", orphan)
    (orphan / "requirements.lock").unlink()  # a lock carries no generated mark: the orphan must hold only ours
    real = shutil.rmtree

    def rmtree(path: object, *args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # held until the removal is done
        real(path, *args, **kwargs)

    monkeypatch.setattr(diskio.shutil, "rmtree", rmtree)
    outcome = run_cli("render", "--matrix", str(root / "matrix.yaml"))
    monkeypatch.undo()
    assert outcome.code == 130, outcome.err
    assert not orphan.exists()


# --- start-up: before the CLI's own handler exists ---------------------------------------------------------

INTERRUPT_ON_IMPORT = """
import importlib.abc, os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

WHEN = sys.argv[1]

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == WHEN:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = [sys.argv[2], "list"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("module", ["xla_images.__main__", "xla_images.extras", "click", "jinja2", "yaml",
                                    "packaging.version", "xla_images.cli.publish"])
def test_ctrl_c_during_start_up_is_exit_130_without_traceback(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", INTERRUPT_ON_IMPORT, module, str(ROOT / "build.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() in STOPPED, result.stderr
