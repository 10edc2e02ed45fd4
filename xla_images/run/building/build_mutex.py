"""One build of a flavour at a time on an engine: an fcntl file lock per local image name.

Two `build` runs of the same flavour would race for `xla-images:<tag>` and write the same
reports/<tag>/build.log. Each run therefore holds an exclusive lock per tag it may build; a second run waits
for the first (saying so, with the holder's pid), then finds the image up to date and skips it. The kernel
releases a lock when its holder exits, however it exits (Ctrl-C, SIGKILL, power cut): a stale lock file is
harmless and is never deleted (deleting it would let two runs lock two different files of the same name).

The lock directory is per machine, not per checkout or per TMPDIR, because the engine's tags are per machine
too: $XLA_IMAGES_LOCK_DIR, else /tmp/xla-images-locks (sticky and world-writable like /tmp, so every user's
builds see each other's locks).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ... import settings
from ...errors import Failure

LOCK_DIR_ENV = settings.LOCK_DIR.env[0]
DEFAULT_LOCK_DIR = Path(settings.LOCK_DIR.default.strip("`"))
POLL_SECONDS = 0.2
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def lock_dir(environ: dict[str, str] | None = None) -> Path:
    return settings.read_lock_dir(environ)


def lock_path(directory: Path, name: str) -> Path:
    # Tags are already file-name safe; anything else is replaced so a name can never leave the directory.
    return directory / f"{_UNSAFE.sub('_', name)}.lock"


@contextlib.contextmanager
def exclusive(names: Iterable[str], *, directory: Path | None = None, timeout: float | None = None,
              waiting: Callable[[str], None] = lambda text: None) -> Iterator[None]:
    """Hold an exclusive lock on each name (in sorted order, so two runs never deadlock) for the block.

    Waits while another process holds one, telling `waiting` once per name; after `timeout` seconds (None:
    no limit) a Failure names the holder. Ctrl-C while waiting interrupts the wait.
    """
    directory = directory or lock_dir()
    try:
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # someone else's directory: theirs to open up
                directory.chmod(0o1777)
    except OSError as error:
        raise Failure(f"cannot create the lock directory {directory}: {error.strerror}", rule="build-lock",
                      hint=f"set {LOCK_DIR_ENV} to a writable directory") from None
    with contextlib.ExitStack() as stack:
        for name in sorted(set(names)):
            stack.enter_context(_one(lock_path(directory, name), name, timeout, waiting))
        yield


@contextlib.contextmanager
def _one(path: Path, name: str, timeout: float | None, waiting: Callable[[str], None]) -> Iterator[None]:
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as error:
        raise Failure(f"cannot open the lock {path}: {error.strerror}", rule="build-lock",
                      hint=f"set {LOCK_DIR_ENV} to a writable directory") from None
    try:
        _acquire(descriptor, path, name, timeout, waiting)
        _write_holder(descriptor)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _acquire(descriptor: int, path: Path, name: str, timeout: float | None, waiting: Callable[[str], None]) -> None:
    started = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        holder = _read_holder(path)
        if not told:
            waiting(f"{name}: another build of it is running ({holder}); waiting for it to finish")
            told = True
        if timeout is not None and time.monotonic() - started > timeout:
            raise Failure(f"{name} is being built by another run ({holder}) for over {timeout:.0f} s",
                          location=str(path), rule="build-lock",
                          hint="wait for it, or stop it; the lock goes when that process exits")
        time.sleep(POLL_SECONDS)


def _write_holder(descriptor: int) -> None:
    # Only for the waiting message: the lock itself is the flock, not this text.
    with contextlib.suppress(OSError):
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()}\n".encode(), 0)


def _read_holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()[:40]
    except OSError:
        text = ""
    return text or "pid unknown"
