"""Bootstrapped base images: `xla-images/base:<python>` from Debian packages, for sites that cannot pull one.

A rendered Dockerfile starts FROM a python base (default `python:X.Y-slim-bookworm`). Where no registry
serves it, `build.py base --python X.Y` makes an equivalent from the Debian suite whose python3 is X.Y:
debootstrap (minbase) with pythonX.Y, its venv module, the shared libpython torch_xla's `_XLAC` links
against, and CA certificates; then `docker import` with labels. Builds pick it up by those labels.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from packaging.version import Version

from ... import userfiles
from ...errors import ConfigError, Failure
from ...names import LABEL_PREFIX
from .. import engine

BASE_REPOSITORY = "xla-images/base"
PYTHON_LABEL = f"{LABEL_PREFIX}.base.python"
SUITE_LABEL = f"{LABEL_PREFIX}.base.suite"


@dataclass(frozen=True)
class Recipe:
    suite: str
    # Packages debootstrap must be told about: its resolver ignores virtual packages, and bookworm's
    # python3.11-venv depends on the virtual python3.11-distutils (provided by python3-distutils).
    extra_packages: tuple[str, ...] = ()


# The Debian suite whose python3 is each python: the one table to edit when Debian moves on.
RECIPES = {
    "3.11": Recipe("bookworm", ("python3-distutils",)),
    "3.13": Recipe("trixie"),
}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHUNK = 1 << 20

Say = Callable[[str], None]


@dataclass(frozen=True)
class BaseImage:
    ref: str
    image_id: str
    python: str
    suite: str
    size_bytes: int
    # None when an existing image was reused.
    bootstrap_seconds: float | None = None
    import_seconds: float | None = None

    @property
    def reused(self) -> bool:
        return self.bootstrap_seconds is None


def base_ref(python: str) -> str:
    return f"{BASE_REPOSITORY}:{python}"


def base_labels(python: str, suite: str) -> dict[str, str]:
    return {PYTHON_LABEL: python, SUITE_LABEL: suite}


def unbuildable_reason(python: str) -> str | None:
    """Why this site cannot bootstrap a base for `python`, or None when it can."""
    if python in RECIPES:
        return None
    known = ", ".join(f"{recipe.suite} has {version}" for version, recipe in RECIPES.items())
    return (f"no supported Debian suite ships python {python} as its python3 ({known}); "
            f"point site.yaml `bases` at an image with python{python} and its shared libpython")


def bootstrappable(pythons: Iterable[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Of these pythons (each once, in version order): those this site can bootstrap, and each other one with
    why it cannot — so a caller bootstraps what it can and says what it cannot, instead of stopping at one."""
    ordered = sorted(set(pythons), key=Version)
    unbuildable = [(python, reason) for python in ordered if (reason := unbuildable_reason(python)) is not None]
    refused = {python for python, _ in unbuildable}
    return [python for python in ordered if python not in refused], unbuildable


def suite_for(python: str, suite: str | None = None) -> str:
    """The suite to bootstrap `python` from; an explicit suite must be the one that ships it."""
    reason = unbuildable_reason(python)
    if reason is not None:
        raise ConfigError(f"cannot bootstrap a base for python {python}", rule="base-python", hint=reason)
    wanted = RECIPES[python].suite
    if suite is not None and suite != wanted:
        raise ConfigError(f"Debian {suite} does not ship python {python} (its suite is {wanted})",
                          rule="base-suite", hint=f"drop --suite, or use --suite {wanted}")
    return wanted


def packages(python: str) -> list[str]:
    """What the base holds besides minbase: python, venv, the shared libpython `_XLAC` needs, CA roots."""
    return [f"python{python}", f"python{python}-venv", f"libpython{python}", "ca-certificates",
            *RECIPES[python].extra_packages]


def find_base(python: str) -> BaseImage | None:
    """The bootstrapped base for `python` on this engine, if any (found by its labels, named by its tag)."""
    labels = engine.images.image_labels(base_ref(python))
    if labels is None or labels.get(PYTHON_LABEL) != python:
        return None
    attrs = engine.images.image_inspect(base_ref(python)) or {}
    return BaseImage(base_ref(python), str(attrs.get("Id", "")), python, labels.get(SUITE_LABEL, "?"),
                     int(attrs.get("Size", 0)))


def ensure_base(python: str, *, suite: str | None = None, mirror: str | None = None, force: bool = False,
                say: Say = print) -> BaseImage:
    """Bootstrap and import `xla-images/base:<python>` unless one with the same labels exists (or force)."""
    suite = suite_for(python, suite)
    existing = find_base(python)
    if existing is not None and existing.suite == suite and not force:
        say(f"{existing.ref} exists (python {python}, Debian {suite}, {existing.size_bytes / 1e6:.0f} MB); "
            "skipping (--force rebuilds it)")
        return existing
    _check_can_bootstrap()
    workdir = Path(tempfile.mkdtemp(prefix=f"xla-images-base-{python}-", dir=_scratch_dir()))
    try:
        rootfs = workdir / "rootfs"
        started = time.monotonic()
        _debootstrap(python, suite, rootfs, mirror, say)
        bootstrap_seconds = time.monotonic() - started
        _trim(rootfs)
        started = time.monotonic()
        image_id = _import(rootfs, python, suite, say)
        import_seconds = time.monotonic() - started
    finally:
        _remove_tree(workdir)
    attrs = engine.images.image_inspect(base_ref(python)) or {}
    result = BaseImage(base_ref(python), image_id, python, suite, int(attrs.get("Size", 0)),
                       bootstrap_seconds, import_seconds)
    say(f"{result.ref}: {result.size_bytes / 1e6:.0f} MB, debootstrap {bootstrap_seconds:.0f} s, "
        f"import {import_seconds:.0f} s")
    return result


def _check_can_bootstrap() -> None:
    if shutil.which("debootstrap") is None:
        raise Failure("debootstrap is not installed", rule="base-debootstrap",
                      hint="run `ci/engine.sh install` (installs debootstrap with the engine)")
    if os.geteuid() != 0:
        raise Failure("debootstrap needs root", rule="base-root", hint="run `sudo ./build.py base ...`")


def _scratch_dir() -> str | None:
    # A rootfs needs a real filesystem (device nodes, ownership): prefer /var/tmp over a tmpfs /tmp.
    return "/var/tmp" if Path("/var/tmp").is_dir() else None


def _debootstrap(python: str, suite: str, rootfs: Path, mirror: str | None, say: Say) -> None:
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(packages(python))}", suite,
               str(rootfs)]
    if mirror:
        command.append(mirror)  # otherwise debootstrap's own default mirror
    say(f"bootstrapping Debian {suite} with {' '.join(packages(python))} (about a minute)")
    log = rootfs.parent / "debootstrap.log"
    with log.open("wb") as output:
        result = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        # debootstrap's own output only says "see debootstrap.log"; the cause is in the log inside the rootfs.
        inner = rootfs / "debootstrap" / "debootstrap.log"
        tail = "\n".join(_tail(log, 6) + (_tail(inner, 10) if inner.is_file() else []))
        raise Failure(f"debootstrap of {suite} failed (exit {result.returncode}):\n{tail}", rule="base-debootstrap",
                      hint="check the network to the Debian mirror (or pass --mirror URL) and the packages named")


def _tail(path: Path, lines: int) -> list[str]:
    return ["  " + line for line in userfiles.tail_lines(path, lines)]


def _trim(rootfs: Path) -> None:
    """Drop package lists and caches: a build that needs apt runs `apt-get update` itself."""
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
                    "var/log/*.log", "var/log/apt/*"):
        for path in rootfs.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()


def _import(rootfs: Path, python: str, suite: str, say: Say) -> str:
    labels = base_labels(python, suite)
    changes = [f"LABEL {key}={value}" for key, value in labels.items()]
    changes += ["ENV LANG=C.UTF-8", f"ENV PATH={PATH}", f'CMD ["python{python}"]']
    say(f"importing {base_ref(python)}")
    repository, tag = base_ref(python).split(":")
    # tar keeps numeric owners, device nodes and hard links as debootstrap made them.
    with subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as tar:
        try:
            image_id = engine.images.import_rootfs(_chunks(tar.stdout), repository, tag, changes)
        finally:
            tar.stdout.close()
            errors = tar.stderr.read().decode(errors="replace")
            tar.wait()
    if tar.returncode != 0:
        raise Failure(f"archiving the rootfs failed: {errors.strip()}", rule="base-import")
    return image_id


def _chunks(stream) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


def _remove_tree(path: Path) -> None:
    """Delete a scratch rootfs, first unmounting anything an interrupted debootstrap left mounted in it
    (deleting through a bind mount of /dev or /proc would reach the host's)."""
    mounts = _mounts_below(path)
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False)
    if _mounts_below(path):
        raise Failure(f"{path} still has mounts; not deleting it", rule="base-cleanup",
                      hint=f"unmount them (see /proc/self/mounts) and remove {path}")
    shutil.rmtree(path, ignore_errors=True)


def _mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 1 and (fields[1] + "/").startswith(prefix):
            found.append(fields[1])
    return found
