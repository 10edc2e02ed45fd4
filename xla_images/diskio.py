"""The one safe writer: every file a command writes, and every generated file it removes, goes through here.

* `write_text_atomic`: temp file in the same directory, fsync, rename; a reader sees the old file or the new
  one, and a failed or interrupted write (ENOSPC, EDQUOT, EROFS, Ctrl-C) leaves the old one and no temp file
  behind. The temp file is created exclusively (O_EXCL, O_NOFOLLOW: a link planted under its name is never
  written through) with a unique name; SIGINT/SIGTERM are held back while it exists, so Ctrl-C lands before or
  after a write, never in one. With `root=`, the path must lie inside `root` with no symlink on the way
  (`inside`); the rename replaces a directory entry and never follows a link at the final name either.
* `replace_in_place`: the same for a user's own file: a symlink stays one (its target is rewritten), the mode
  stays what it was.
* `inside`: the check itself — every existing component below `root` is lstat-ed: a symlink is `disk-symlink`,
  a file where a directory belongs (or a directory where a file belongs) is `disk-type`, a path that leaves
  `root` (`..`) is `disk-outside`; all ConfigErrors naming the component.
* `remove_file` / `remove_tree`: delete under `root` after the same check, never through a symlink.
* `LogFile`: a streamed log (build.log) opened on first use; the first write that fails becomes a Failure
  naming the log, later writes are dropped (the run stops, it need not fail again while saying so).
* `failure`: an OSError turned into the Failure the CLI prints (exit 1).
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .errors import ConfigError, Failure, Location

_SPACE = {errno.ENOSPC, errno.EDQUOT}
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# The mode a checkout's files get (read by builders and other users); read once, os.umask can only be read by
# setting it.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def failure(error: OSError, path: Path | str | None = None, what: str = "") -> Failure:
    """`cannot write build.log /x/reports/t/build.log: No space left on device` (+ how to get out)."""
    where = str(path or error.filename or "")
    reason = error.strerror or type(error).__name__
    hint = ("free space there, or point the output elsewhere (--reports, --published, TMPDIR for build contexts)"
            if error.errno in _SPACE else "check the path's permissions and that its file system is writable")
    subject = " ".join(part for part in (what, where) if part)
    return Failure(f"cannot write {subject or 'a file'}: {reason}", location=where or None, rule="disk-write",
                   hint=hint)


def inside(root: Path, path: Path, *, directory: bool = False) -> Path:
    """`path` (absolute, or relative to `root`) checked to lie inside `root` with no symlink and no wrong shape on
    the way; returns it absolute. `directory`: the final component must be a directory when it exists (else a
    regular file). Components that do not exist yet are fine: the writer creates them."""
    root = Path(os.path.abspath(root))
    full = Path(os.path.abspath(root / path))  # normalises `..` without following links
    if full != root and root not in full.parents:
        raise ConfigError(f"{path} lies outside {root}", location=Location(str(path)), rule="disk-outside",
                          hint="xla-images writes only inside the repository (or the output you name)")
    parts = full.relative_to(root).parts
    current = root
    for index, part in enumerate(parts):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return full
        except OSError as error:
            raise failure(error, current) from None
        last = index == len(parts) - 1
        if stat.S_ISLNK(mode):
            raise ConfigError("is a symlink; xla-images writes no file through a link",
                              location=Location(str(current)), rule="disk-symlink",
                              hint="remove the link; xla-images writes a real file or folder there")
        wants_directory = directory or not last
        if wants_directory and not stat.S_ISDIR(mode):
            raise ConfigError("is a file where a directory belongs", location=Location(str(current)),
                              rule="disk-type", hint="move it away; xla-images writes a directory there")
        if not wants_directory and stat.S_ISDIR(mode):
            raise ConfigError("is a directory where a file belongs", location=Location(str(current)),
                              rule="disk-type", hint="move it away; xla-images writes a file there")
    return full


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the block (main thread; elsewhere a no-op): delivered right after it.

    Held by handlers that only take note, not by a signal mask: the kernel hands a process-directed signal to any
    thread that does not block it, and a mask set here would cover the main thread only (any other thread, a
    worker pool's or a server's, would take the signal and Python would still raise it in the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {number: signal.signal(number, lambda received, frame: pending.append(received))
                for number in _HELD_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if pending:
            _deliver(pending[0], previous[pending[0]])


def _deliver(number: int, handler: Any) -> None:
    """What the signal would have done outside the block: its handler, or its default action."""
    if callable(handler):
        handler(number, None)
    elif handler in (signal.SIG_DFL, None):  # None: a handler not set from Python; take the default
        os.kill(os.getpid(), number)


def write_text_atomic(path: Path, text: str, what: str = "", *, root: Path | None = None,
                      shared: bool = False, mode: int | None = None) -> None:
    """Replace `path` by `text` all at once; on any error or interrupt the old file stays and no temp file is left.

    `root`: refuse (ConfigError) a `path` outside it or reached through a symlink, or of the wrong shape.
    `shared`: the file gets the umask's mode like any checkout file (generated files); else it stays private
    (0600, reports and records). `mode`: exactly this mode (replace_in_place keeps the old file's).
    """
    if root is not None:
        path = inside(root, path)
    elif path.is_dir() and not path.is_symlink():
        raise ConfigError("is a directory where a file belongs", location=Location(str(path)), rule="disk-type",
                          hint="name a file, not a folder")
    try:
        _make_directories(path.parent, root)
    except OSError as error:
        raise failure(error, path.parent, what) from None
    with signals_held():
        temporary = _create_exclusive(path, what)
        try:
            with os.fdopen(temporary[0], "w", encoding="utf-8") as stream:
                if mode is not None or shared:
                    os.fchmod(stream.fileno(), mode if mode is not None else 0o666 & ~_UMASK)
                stream.write(text)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary[1], path)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary[1])
            if isinstance(error, IsADirectoryError):
                raise ConfigError("is a directory where a file belongs", location=Location(str(path)),
                                  rule="disk-type", hint="move it away; xla-images writes a file there") from None
            if isinstance(error, OSError):
                raise failure(error, path, what) from None
            raise


def replace_in_place(path: Path, text: str, what: str = "") -> Path:
    """Rewrite a file the user keeps (matrix.yaml, matrix.wheels.json) as an editor would; returns what was written.

    A symlink at `path` stays a symlink: the file it points to is rewritten (atomically, as write_text_atomic).
    The file keeps its mode (a committed file is not made private); a new file gets the umask's, like any
    checkout file.
    """
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise failure(error, target, what) from None
    write_text_atomic(target, text, what, shared=True, mode=mode)
    return target


def make_directory(directory: Path, root: Path | None = None) -> None:
    """`mkdir -p directory` (inside `root` when given), a file or link of the wrong kind on the way a ConfigError
    (`disk-type`, `disk-symlink`) naming it, a full or read-only disk a Failure (`disk-write`)."""
    try:
        _make_directories(directory, root)
    except OSError as error:
        raise failure(error, directory, "a folder") from None


def _make_directories(directory: Path, root: Path | None) -> None:
    if root is not None:
        inside(root, directory, directory=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file (or a dangling link) where a directory belongs
        raise ConfigError("is not a directory", location=Location(str(directory)), rule="disk-type",
                          hint="name an output inside a directory") from None
    except NotADirectoryError:
        raise ConfigError("a parent of this path is a file, not a directory", location=Location(str(directory)),
                          rule="disk-type", hint="name an output inside a directory") from None


def _create_exclusive(path: Path, what: str) -> tuple[int, str]:
    """A new temp file beside `path`: a unique name, created exclusively, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temporary = str(path.parent / f".{path.name[:100]}-{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temporary, flags, 0o600), temporary
        except FileExistsError:
            continue
        except OSError as error:
            raise failure(error, path, what) from None
    raise Failure(f"cannot create a temporary file beside {path}", location=str(path), rule="disk-write")


def remove_file(root: Path, path: Path) -> None:
    """Delete the regular file `path` under `root` (never through a symlink on the way)."""
    full = inside(root, path)
    with signals_held():
        try:
            os.unlink(full)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise failure(error, full, "(removing)") from None


def remove_tree(root: Path, path: Path) -> None:
    """Delete the directory `path` under `root` and what it holds; links inside are removed, never followed."""
    full = inside(root, path, directory=True)
    with signals_held():
        try:
            shutil.rmtree(full)  # fd-based where the platform allows: immune to a link swapped in meanwhile
        except FileNotFoundError:
            pass
        except OSError as error:
            raise failure(error, full, "(removing)") from None


class LogFile:
    """A log written line by line; see the module docstring."""

    def __init__(self, path: Path, what: str = "the log") -> None:
        self.path = path
        self.what = what
        self.failed = False
        self._stream: IO[str] | None = None

    def write(self, text: str) -> None:
        if self.failed:
            return
        try:
            if self._stream is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._stream = self.path.open("w", encoding="utf-8")
            self._stream.write(text)
            self._stream.flush()
        except OSError as error:
            self.failed = True
            self.close()
            raise failure(error, self.path, self.what) from None

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(OSError):  # what could not be flushed is lost either way
                stream.close()

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
