"""Reads from the network that end: an overall deadline per exchange and a byte bound per body.

requests' `timeout` bounds each socket read, not the exchange: a server that sends one byte every 25 s never
trips a 60 s read timeout and holds the command for days. Here the deadline bites at the socket itself:

* `deadline(seconds, host=..., what=..., rule=...)` is a context manager; every socket read made in its block
  (status line, headers, body, on this thread) first sets the socket's timeout to min(the per-read timeout, the
  time left), so a dribbling server is cut when the time is up, not when it stops. Deadlines nest (a command's
  around each request's): the earliest end applies. An exchange that fails after its deadline passed is
  reported as the deadline's Failure under its rule (`registry-slow`, `index-slow`, ...), naming the host,
  what was read and the limit in seconds, never as a timeout traceback or a retry;
* `DeadlineAdapter` is the requests adapter whose connections do that (mount it on the session; the registry
  client's trust adapter is one); outside any `deadline` block it behaves as requests' own;
* `read_body(response, limit, ...)` and `iter_body(...)` read a streamed body (`stream=True`) up to `limit`
  bytes, refusing a larger one as it grows (a declared Content-Length over the limit before the first read),
  and report a body cut short, a broken encoding (gzip) or a broken connection as a Failure, not a traceback.

run/registry/, run/packages/index.py and run/shipping/promote.py (a blob copy's deadline) import this; it imports nothing of
xla_images but errors.
"""
from __future__ import annotations

import io
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..errors import Failure

CHUNK = 1 << 16
_local = threading.local()


@dataclass
class Deadline:
    """The end of one exchange (or of a whole command): `seconds` from when it was made."""

    seconds: float
    host: str
    what: str
    rule: str = "registry-slow"
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = time.monotonic() + self.seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def failure(self) -> Failure:
        return Failure(f"{self.host}: {self.what} did not finish within {self.seconds:g} s (the overall deadline)",
                       rule=self.rule, hint=f"{self.host} answers too slowly (or dribbles its answer); try again "
                                            "later, or check the network and any proxy in between")


def _stack() -> list[Deadline]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack  # type: ignore[no-any-return]


def current() -> Deadline | None:
    """The deadline that ends first among those in force on this thread, or None."""
    stack = _stack()
    return min(stack, key=lambda each: each.end) if stack else None


def check() -> None:
    """Raise the current deadline's Failure when it has passed (between reads, before a retry's wait)."""
    now = current()
    if now is not None and now.passed():
        raise now.failure()


@contextmanager
def deadline(seconds: float, *, host: str, what: str, rule: str = "registry-slow") -> Iterator[Deadline]:
    """Every socket read in the block ends by `seconds` from now; an error after that is the deadline's Failure."""
    made = Deadline(seconds, host, what, rule)
    stack = _stack()
    stack.append(made)
    try:
        yield made
    except BaseException as error:
        passed = current()
        if passed is not None and passed.passed() and not isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise passed.failure() from None
        raise
    finally:
        stack.remove(made)


# --- the socket reads ------------------------------------------------------------------------------------

class _DeadlineSocket:
    """A connection's socket whose every read (and send) waits at most min(its own timeout, the current deadline's
    rest); outside any deadline, its own timeout as urllib3 set it."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        now = current()
        if now is None:
            self._sock.settimeout(self._timeout)
            return
        left = now.remaining()
        if left <= 0:
            raise socket.timeout(f"the {now.seconds:g} s deadline passed")
        self._sock.settimeout(left if self._timeout is None else min(self._timeout, left))

    def recv_into(self, buffer: Any, *args: Any) -> int:
        self._arm()
        return int(self._sock.recv_into(buffer, *args))

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return bytes(self._sock.recv(*args))

    def send(self, data: Any, *args: Any) -> int:
        self._arm()
        return int(self._sock.send(data, *args))

    def sendall(self, data: Any, *args: Any) -> None:
        self._arm()
        self._sock.sendall(data, *args)

    def makefile(self, mode: str = "r", buffering: int | None = None, **_: Any) -> Any:
        # http.client reads the status line, headers and body through this file: its reads come back here. As
        # socket.makefile does, the file holds a reference: the socket closes when both are closed (http.client
        # closes the connection of a `Connection: close` answer before its body is read).
        raw = socket.SocketIO(self, "rb" if "r" in mode else "wb")  # type: ignore[arg-type]
        self._sock._io_refs += 1
        if buffering == 0:
            return raw
        return io.BufferedReader(raw) if "r" in mode else io.BufferedWriter(raw)

    def _decref_socketios(self) -> None:
        self._sock._decref_socketios()


class _DeadlineHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock)  # type: ignore[assignment]


class _DeadlineHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()  # the TLS handshake is bounded by the connect timeout, clamped in DeadlineAdapter.send
        self.sock = _DeadlineSocket(self.sock)  # type: ignore[assignment]


class _DeadlineHTTPPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


def _deadline_pools(manager: Any) -> Any:
    if manager.pool_classes_by_scheme.get("http") is HTTPConnectionPool:  # not a SOCKS manager's own pools
        manager.pool_classes_by_scheme = {"http": _DeadlineHTTPPool, "https": _DeadlineHTTPSPool}
    return manager


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter, with connections whose reads end at the current deadline (see the module docstring)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _deadline_pools(self.poolmanager)

    def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
        return _deadline_pools(super().proxy_manager_for(*args, **kwargs))

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,
             *args: Any, **kwargs: Any) -> requests.Response:
        now = current()
        if now is not None:
            check()
            left = now.remaining()
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            timeout = (left if connect is None else min(connect, left), read)
        return super().send(request, stream, timeout, *args, **kwargs)


# --- bounded bodies --------------------------------------------------------------------------------------

def iter_body(response: requests.Response, limit: int, *, host: str, what: str,
              rule: str = "registry-answer") -> Iterator[bytes]:
    """The streamed body in chunks, at most `limit` bytes in all; a Failure (never a traceback) otherwise."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise too_big(host, what, f"{declared} bytes", limit, rule)
    size = 0
    try:
        for chunk in response.iter_content(chunk_size=CHUNK):
            size += len(chunk)
            if size > limit:
                raise too_big(host, what, "more than that", limit, rule)
            yield chunk
    except (requests.RequestException, OSError, ValueError) as error:
        check()
        raise Failure(f"{host}: {what}: the answer broke off or cannot be decoded ({_reason(error)})", rule=rule,
                      hint="the server (or a proxy) cut the body short or sent a broken encoding: try again; "
                           "if it persists, the server is at fault") from None
    finally:
        response.close()


def read_body(response: requests.Response, limit: int, *, host: str, what: str,
              rule: str = "registry-answer") -> bytes:
    """The whole streamed body, read up to `limit` bytes: a larger one is refused before it is all in memory."""
    return b"".join(iter_body(response, limit, host=host, what=what, rule=rule))


def too_big(host: str, what: str, size: str, limit: int, rule: str) -> Failure:
    return Failure(f"{host}: {what}: the answer is {size}, at most {limit} bytes expected", rule=rule,
                   hint="the server (or a proxy before it) answers something else than the protocol's document")


def _reason(error: BaseException) -> str:
    text = str(error)
    for needle in ("IncompleteRead", "Incomplete", "decompress", "Decode", "timed out", "reset"):
        if needle.lower() in text.lower():
            return f"{type(error).__name__}: {needle.lower()}"
    return type(error).__name__
