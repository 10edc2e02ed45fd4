"""xla-images as a new user gets it: a wheel built from this checkout, installed (not editable, no extras) into a
fresh venv outside the checkout.

`install(workdir)` builds the wheel from a copy of the checkout's files (tracked and untracked, not ignored), so
nothing is written into the checkout and no stale build/ of an earlier run leaks into the wheel, then installs
it with its pinned dependencies. conftest.py's session fixture `plain_install` does this once per session
(~30-60 s; pip's own cache makes later sessions faster). `PlainInstall` is path-like (the venv's `xla-images`
executable) and runs it with an environment that cannot reach the checkout: no PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIP = ("-m", "pip", "--disable-pip-version-check")


@dataclass(frozen=True)
class PlainInstall:
    venv: Path
    wheel: Path

    @property
    def executable(self) -> Path:
        return self.venv / "bin" / "xla-images"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def __fspath__(self) -> str:
        return str(self.executable)

    def __str__(self) -> str:
        return str(self.executable)

    def run(self, *args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """`xla-images ARGS` in `cwd`, plain output (CI=true), as the installed product only."""
        return subprocess.run([str(self.executable), *args], cwd=cwd, env=environment(), capture_output=True,
                              text=True, timeout=timeout)


def environment() -> dict[str, str]:
    """This process's environment (PIP_CERT and the like) without what would import the checkout instead."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env["CI"] = "true"
    return env


def install(workdir: Path) -> PlainInstall:
    source, dist, venv = workdir / "source", workdir / "dist", workdir / "venv"
    copy_checkout(source)
    _run([sys.executable, *PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(source)])
    (wheel,) = dist.glob("xla_images-*.whl")
    # The interpreter this venv is based on, not this process's venv: nothing of it may leak in.
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)])
    installed = PlainInstall(venv, wheel)
    _run([str(installed.python), *PIP, "install", "--quiet", str(wheel)])
    return installed


# Without git (a source tarball): what .gitignore names that a wheel build would pick up or that is big.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "reports", "wheelhouse",
                                    ".hypothesis", ".pytest_cache")


def copy_checkout(target: Path) -> None:
    """The checkout's files as git sees them (symlinks kept as symlinks), without .git and ignored files."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], check=True, capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(REPO, target, symlinks=True, ignore=NOT_SOURCE)
        return
    for relative in filter(None, listed):
        source = REPO / relative
        if not os.path.lexists(source):
            continue  # deleted in the working tree, not yet committed
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination, follow_symlinks=False)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
