"""Reading a file a user hands us, bounded: whatever the path names, an answer in milliseconds.

A path argument can name a directory, a fifo (opening it would wait for a writer forever), a device such as
/dev/zero (reading it never ends), a symlink loop, a binary file or a file far larger than any input we
read. Each becomes a ConfigError naming the file and a rule, before more than `limit` bytes are read.

Generated and committed files (Dockerfiles, wheel-build .env files, docker-bake.json, workflows, locks) are
read through here too, with `follow_symlinks=False`: a link planted where a generated file belongs is refused
(file-type) instead of read through, and `read_optional` tells "not there" (None) from "there but not text".

Rules: file-exists, file-readable (permissions, symlink loops), file-type (not a regular file, or a symlink
where none may be), file-size (over the limit), file-encoding (not UTF-8 text, or binary).
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
# Generated files: the largest committed one (docker-bake.json) is ~40 KiB for the whole matrix.
GENERATED_LIMIT = 1 * MIB
# A cosign key (PEM) is under 1 KiB; a --protect list of digests ~100 bytes a line.
KEY_LIMIT = 64 * KIB
PROTECT_LIMIT = 8 * MIB
# A CA bundle (PEM): Debian's whole ca-certificates.crt is a few hundred KiB.
CA_LIMIT = 4 * MIB
_CHUNK = 64 * KIB


def read_text(path: Path, *, limit: int, missing_hint: str | None = None, follow_symlinks: bool = True) -> str:
    """The UTF-8 text of the regular file `path` (a leading BOM dropped), at most `limit` bytes.

    `follow_symlinks=False`: a symlink at `path` itself is refused (file-type) and never opened.
    """
    shown = str(path)
    data = _read_bytes(path, shown, limit, missing_hint, follow_symlinks)
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


# Digits of an integer in a JSON file (published.json's schema, the wheel cache's): a few. A longer one is refused
# before int() sees it (json.loads' parse_int), never converted up to Python's 4300-digit limit (issue 41).
MAX_INT_DIGITS = 32


def bounded_int(text: str) -> int:
    """json.loads' parse_int: an integer of at most MAX_INT_DIGITS characters; ValueError past that."""
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"a number of {len(text)} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def read_bytes(path: Path, *, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` (a file compared byte for byte, as a CA bundle)."""
    return _read_bytes(path, str(path), limit, None)


def read_optional(path: Path, *, limit: int = GENERATED_LIMIT, follow_symlinks: bool = False) -> str | None:
    """`read_text` of a file that may be absent (a generated file not rendered yet): None when nothing is there.

    Anything else that is not a bounded UTF-8 regular file (a directory, fifo, symlink, device, huge or
    Latin-1 file) is a ConfigError naming it, so a caller decides what such a file means.
    """
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _open_error(error, str(path)) from None
    return read_text(path, limit=limit, follow_symlinks=follow_symlinks)


def tail_lines(path: Path, lines: int, *, window: int = 64 * KIB) -> list[str]:
    """The last `lines` lines of a log we wrote (build.log, debootstrap.log), reading at most its last `window`
    bytes, undecodable bytes replaced; [] when it cannot be read. A log may be gigabytes: only its end is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return []
        os.lseek(fd, max(info.st_size - window, 0), os.SEEK_SET)
        data = os.read(fd, window)
    except OSError:
        return []
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


def _read_bytes(path: Path, shown: str, limit: int, missing_hint: str | None, follow_symlinks: bool = True) -> bytes:
    # O_NONBLOCK: opening a fifo must not wait for a writer; it is refused below as not a regular file.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConfigError("file not found", location=Location(shown), rule="file-exists",
                          hint=missing_hint or "check the path, or create the file") from None
    except OSError as error:
        if not follow_symlinks and error.errno == errno.ELOOP and os.path.islink(path):
            raise ConfigError("is a symlink where a file xla-images generates belongs", location=Location(shown),
                              rule="file-type", hint="remove the link; `./build.py render` writes the file") from None
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
