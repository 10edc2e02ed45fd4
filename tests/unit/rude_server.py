"""A misbehaving HTTP server on 127.0.0.1 for tests of reads that must end: it answers each request with what a
test scripts, byte by byte if asked (a server dribbling one byte every so often), endlessly, or cut short.

Every wait is bounded: client sockets get a timeout, a dribble stops after MAX_SECONDS or when the server is
closed, and the threads are daemons."""
from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Callable

MAX_SECONDS = 20.0
Script = Callable[["Exchange"], None]


class Exchange:
    """One request the server received and the socket to answer it on."""

    def __init__(self, conn: socket.socket, head: bytes, stop: threading.Event) -> None:
        self.conn, self.head, self._stop = conn, head, stop
        first = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        self.method, self.path = (first + ["", ""])[:2]

    def send(self, data: bytes) -> None:
        self.conn.sendall(data)

    def dribble(self, data: bytes, every: float) -> None:
        """`data` one byte at a time, `every` seconds apart (until the server closes or MAX_SECONDS pass)."""
        started = time.monotonic()
        if not data:
            self._stop.wait(every)  # a pause
        for index in range(len(data)):
            if self._stop.wait(every) or time.monotonic() - started > MAX_SECONDS:
                return
            self.conn.sendall(data[index:index + 1])

    def endless(self, chunk: bytes = b"x" * 65536) -> None:
        """Bytes until the client stops reading or the server closes (bounded by MAX_SECONDS)."""
        started = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - started < MAX_SECONDS:
            self.conn.sendall(chunk)


class RudeServer:
    """Serves `script(exchange)` for every request on 127.0.0.1; `requests` records (method, path)."""

    def __init__(self, script: Script, context: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.context = context  # serve TLS with it
        self.requests: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            while not self._stop.is_set():  # keep-alive: one script run per request on the connection
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                exchange = Exchange(conn, head, self._stop)
                self.requests.append((exchange.method, exchange.path))
                self.script(exchange)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


def answer(status: int, headers: dict[str, str], body: bytes = b"", *, length: int | None = None) -> bytes:
    """An HTTP/1.1 answer's bytes; `length` declares another Content-Length than the body's (a short body)."""
    lines = [f"HTTP/1.1 {status} X"] + [f"{key}: {value}" for key, value in headers.items()]
    if "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
