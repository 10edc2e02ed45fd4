"""Reading a file a user hands us, bounded: whatever the path names, an answer in milliseconds.

A path argument can name a directory, a fifo (opening it would wait for a writer forever), a device such as
/dev/zero (reading it never ends), a symlink loop, a binary file or a file far larger than any input we
read. Each becomes a ConfigError naming the file and a rule, before more than `limit` bytes are read.

Rules: file-exists, file-readable (permissions, symlink loops), file-type (not a regular file),
file-size (over the limit), file-encoding (not UTF-8 text, or binary).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import ConfigError, Location

KIB = 1024
MIB = 1024 * KIB
# What the hand-written inputs may weigh. The committed matrix.yaml is ~2 KiB; a 256 KiB matrix is already
# thousands of releases. Larger files are refused before parsing so parse time stays well under a second.
YAML_LIMIT = 256 * KIB
# published.json grows by ~1 KiB per pushed flavour; lock files by ~200 bytes per wheel.
JSON_LIMIT = 8 * MIB
LOCK_LIMIT = 1 * MIB
_CHUNK = 64 * KIB


def read_text(path: Path, *, limit: int, missing_hint: str | None = None) -> str:
    """The UTF-8 text of the regular file `path` (a leading BOM dropped), at most `limit` bytes."""
    shown = str(path)
    data = _read_bytes(path, shown, limit, missing_hint)
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise ConfigError("binary file (it contains NUL bytes), not text", location=Location(shown, line),
                          rule="file-encoding", hint="pass the text file this option expects")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"not UTF-8 text: byte {data[error.start]:#04x} at offset {error.start}",
                          location=Location(shown, line), rule="file-encoding",
                          hint="save the file as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def _read_bytes(path: Path, shown: str, limit: int, missing_hint: str | None) -> bytes:
    try:
        # O_NONBLOCK: opening a fifo must not wait for a writer; it is refused below as not a regular file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError("file not found", location=Location(shown), rule="file-exists",
                          hint=missing_hint or "check the path, or create the file") from None
    except OSError as error:
        raise _open_error(error, shown) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError("is a directory, not a file", location=Location(shown), rule="file-type",
                              hint="name the file inside it")
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"not a regular file (a {_kind(info.st_mode)})", location=Location(shown),
                              rule="file-type", hint="pass a regular file")
        if info.st_size > limit:
            raise _too_big(shown, info.st_size, limit)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the size can change between fstat and read: stop one byte past the limit
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise _too_big(shown, size, limit)
        return b"".join(chunks)
    except OSError as error:
        raise ConfigError(f"cannot read file: {error.strerror}", location=Location(shown),
                          rule="file-readable") from None
    finally:
        os.close(fd)


def _open_error(error: OSError, shown: str) -> ConfigError:
    if error.errno == errno.ELOOP:
        return ConfigError("too many levels of symbolic links (a symlink loop?)", location=Location(shown),
                           rule="file-readable", hint="point the path at a real file")
    if error.errno == errno.ENOTDIR:
        return ConfigError("a parent of this path is not a directory", location=Location(shown),
                           rule="file-exists")
    if error.errno == errno.ENAMETOOLONG:
        return ConfigError("file name too long", location=Location(shown[:200] + "..."), rule="file-exists")
    return ConfigError(f"cannot open file: {error.strerror}", location=Location(shown), rule="file-readable",
                       hint="check the file's permissions")


def _too_big(shown: str, size: int, limit: int) -> ConfigError:
    return ConfigError(f"file is larger than the {limit // KIB} KiB this input may be ({size} bytes or more)",
                       location=Location(shown), rule="file-size",
                       hint="is this the right file? inputs are small hand-written or generated text files")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def resolve_path(path: Path) -> Path:
    """`path.resolve()`, but a symlink loop is a ConfigError instead of a RuntimeError traceback."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        raise ConfigError("too many levels of symbolic links (a symlink loop?)", location=Location(str(path)),
                          rule="file-readable", hint="point the path at a real file") from None
