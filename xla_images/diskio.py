"""Writing reports and records when the disk may be full: a clear Failure naming the path, never half a file.

* `write_text_atomic`: temp file in the same directory, fsync, rename; a reader sees the old file or the new
  one, and a failed write (ENOSPC, EDQUOT, EROFS) leaves the old one and no temp file behind.
* `LogFile`: a streamed log (build.log) opened on first use; the first write that fails becomes a Failure
  naming the log, later writes are dropped (the run stops, it need not fail again while saying so).
* `failure`: an OSError turned into the Failure the CLI prints (exit 1).
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO

from .errors import Failure

_SPACE = {errno.ENOSPC, errno.EDQUOT}


def failure(error: OSError, path: Path | str | None = None, what: str = "") -> Failure:
    """`cannot write build.log /x/reports/t/build.log: No space left on device` (+ how to get out)."""
    where = str(path or error.filename or "")
    reason = error.strerror or type(error).__name__
    hint = ("free space there, or point the output elsewhere (--reports, --published, TMPDIR for build contexts)"
            if error.errno in _SPACE else "check the path's permissions and that its file system is writable")
    subject = " ".join(part for part in (what, where) if part)
    return Failure(f"cannot write {subject or 'a file'}: {reason}", location=where or None, rule="disk-write",
                   hint=hint)


def write_text_atomic(path: Path, text: str, what: str = "") -> None:
    """Replace `path` by `text` all at once; on any error the old file stays and no temp file is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise failure(error, path, what) from None
        raise


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
