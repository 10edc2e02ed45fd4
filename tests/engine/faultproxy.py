"""A fault-injecting TCP proxy for an HTTP/1.1 registry on loopback (stdlib only, one thread per direction).

Put it between a client (dockerd pushing or pulling, our RegistryClient) and a real docker-registry:

    proxy = FaultProxy(upstream=("127.0.0.1", 5020), port=5021, lifetime=120)
    proxy.add(Fault("reset", method="PATCH", path="/blobs/uploads/", after_bytes=1 << 20))
    with proxy:
        ... push to 127.0.0.1:5021/repo ...
    proxy.fired  # which faults really happened, in order

Every request is made the only one of its connection (the proxy rewrites `Connection: close` into the
request head), so faults can be aimed at one request by method and path. Registries build `Location` URLs
from the Host header, so upload sessions come back through the proxy too. Faults:

  reset   after `after_bytes` bytes of the body (`direction` request: upload; response: download) both sides
          get a TCP RST (SO_LINGER 0), like a dropped link or a crashed middlebox.
  stall   after `after_bytes` bytes, nothing moves for `seconds`, then traffic resumes.
  status  the request never reaches the registry; the client gets HTTP `status` (a 500/503 burst).
  slow    the connection is throttled to `rate` bytes per second each way (a slow link).

Each fault hits `times` matching requests, then lets them pass. Anything that is not plain HTTP (dockerd's
TLS probe of an insecure registry) is forwarded untouched. The proxy stops by itself after `lifetime`
seconds, so a stuck test cannot leave it running. `python faultproxy.py --help` runs it on its own.
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

HEAD_LIMIT = 64 << 10
CHUNK = 64 << 10
KINDS = ("reset", "stall", "status", "slow")
REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout", 429: "Too Many Requests"}


@dataclass
class Fault:
    kind: str
    method: str = ""  # regex, searched in the request method ("" matches any)
    path: str = ""  # regex, searched in the request target
    times: int = 1  # matching requests it hits; -1: every one
    after_bytes: int = 0  # reset/stall: body bytes let through first
    direction: str = "request"  # reset/stall: count the request body (upload) or the response (download)
    seconds: float = 5.0  # stall
    status: int = 503  # status
    rate: int = 256 << 10  # slow: bytes per second

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {KINDS}")
        if self.direction not in ("request", "response"):
            raise ValueError(f"direction {self.direction!r} is not request or response")

    def matches(self, method: str, target: str) -> bool:
        return bool(re.search(self.method, method)) and bool(re.search(self.path, target))


@dataclass(frozen=True)
class Fired:
    kind: str
    method: str
    target: str
    at: float


@dataclass
class _Armed:
    fault: Fault
    left: int


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    port: int
    lifetime: float = 120.0
    host: str = "127.0.0.1"
    faults: list[_Armed] = field(default_factory=list)
    fired: list[Fired] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    # Request bytes (heads and bodies) sent on to the upstream: how much of an upload reached it.
    forwarded: int = 0

    def __post_init__(self) -> None:
        if not self.host.startswith("127."):
            raise ValueError("the fault proxy binds loopback only")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    # --- control ---------------------------------------------------------------------------------------

    def add(self, *faults: Fault) -> FaultProxy:
        with self._lock:
            self.faults.extend(_Armed(fault, fault.times) for fault in faults)
        return self

    def clear(self) -> None:
        """Disarm every fault; traffic passes untouched from now on."""
        with self._lock:
            self.faults.clear()

    def fired_kinds(self) -> list[str]:
        with self._lock:
            return [item.kind for item in self.fired]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.host, self.port))
        server.listen(64)
        server.settimeout(0.2)
        self._server = server
        self._deadline = time.monotonic() + self.lifetime
        self._thread = threading.Thread(target=self._accept_loop, name=f"faultproxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_all()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- plumbing --------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._server is not None
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                try:
                    client, _ = self._server.accept()
                except socket.timeout:
                    continue
                except OSError:
                    break
                self._track(client)
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()
        finally:
            self._server.close()
            self._close_all()  # the lifetime is over: cut whatever is still open

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            _close(sock)

    def _pick(self, method: str, target: str) -> Fault | None:
        with self._lock:
            self.requests.append((method, target))
            for armed in self.faults:
                if armed.left != 0 and armed.fault.matches(method, target):
                    armed.left -= 1
                    self.fired.append(Fired(armed.fault.kind, method, target, time.time()))
                    return armed.fault
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            client.settimeout(30)
            head, rest = _read_head(client)
            parsed = _parse_head(head)
            fault = None
            if parsed is not None:
                method, target = parsed
                fault = self._pick(method, target)
                head = _one_request_per_connection(head)
            if fault is not None and fault.kind == "status":
                _answer_status(client, fault.status)
                return
            upstream = socket.create_connection(self.upstream, timeout=30)
            self._track(upstream)
            upstream.sendall(head + rest)
            self._count(head + rest, "request")
            body_sent = len(rest)
            up = threading.Thread(target=self._pump, args=(client, upstream, fault, "request", body_sent),
                                  daemon=True)
            up.start()
            self._pump(upstream, client, fault, "response", 0)
            up.join(timeout=60)
        except OSError:
            pass
        finally:
            _close(client)
            if upstream is not None:
                _close(upstream)

    def _count(self, data: bytes, direction: str) -> None:
        if direction == "request":
            with self._lock:
                self.forwarded += len(data)

    def _pump(self, source: socket.socket, sink: socket.socket, fault: Fault | None, direction: str,
              already: int) -> None:
        moved = already
        stalled = False
        source.settimeout(300)
        try:
            while not self._stop.is_set():
                data = source.recv(CHUNK if fault is None or fault.kind != "slow" else max(1, fault.rate // 20))
                if not data:
                    break
                if fault is not None and fault.direction == direction and fault.kind in ("reset", "stall"):
                    if moved + len(data) > fault.after_bytes and not stalled:
                        keep = max(0, fault.after_bytes - moved)
                        sink.sendall(data[:keep])
                        moved += keep
                        data = data[keep:]
                        if fault.kind == "reset":
                            _reset(source)
                            _reset(sink)
                            return
                        stalled = True
                        self._stop.wait(fault.seconds)
                sink.sendall(data)
                self._count(data, direction)
                moved += len(data)
                if fault is not None and fault.kind == "slow":
                    time.sleep(len(data) / fault.rate)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            _close(source)
            _close(sink)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and whatever body bytes came with it; raw data otherwise."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < HEAD_LIMIT:
        chunk = sock.recv(CHUNK)
        if not chunk:
            break
        data += chunk
        if not re.match(rb"^[A-Z]", data):
            return b"", data  # a TLS hello or other non-HTTP bytes: forward untouched
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return b"", data
    return data[:end + 4], data[end + 4:]


def _parse_head(head: bytes) -> tuple[str, str] | None:
    found = re.match(rb"^([A-Z]+) (\S+) HTTP/1\.[01]\r\n", head)
    return (found.group(1).decode(), found.group(2).decode("latin-1")) if found else None


def _one_request_per_connection(head: bytes) -> bytes:
    lines = head[:-4].split(b"\r\n")
    kept = [line for line in lines if not re.match(rb"(?i)^(connection|keep-alive|proxy-connection):", line)]
    return b"\r\n".join(kept + [b"Connection: close"]) + b"\r\n\r\n"


def _answer_status(client: socket.socket, status: int) -> None:
    body = json.dumps({"errors": [{"code": "UNAVAILABLE", "message": f"fault proxy: injected {status}"}]}).encode()
    reason = REASONS.get(status, "Error")
    client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    # Let the client finish sending a body it had started, so it reads our answer instead of a reset.
    client.shutdown(socket.SHUT_WR)
    client.settimeout(2)
    try:
        while client.recv(CHUNK):
            pass
    except OSError:
        pass


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _fault_from_text(text: str) -> Fault:
    """`reset:method=PATCH,after_bytes=1048576` -> Fault('reset', method='PATCH', after_bytes=1048576)."""
    kind, _, options = text.partition(":")
    values: dict[str, object] = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        values[key] = value if key in ("method", "path", "direction") else float(value) if key == "seconds" \
            else int(value)
    return Fault(kind, **values)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fault-injecting proxy for a registry on loopback.")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the registry")
    parser.add_argument("--fault", action="append", default=[], help="KIND:key=value,... (repeatable)")
    parser.add_argument("--lifetime", type=float, default=120.0, help="stop by itself after this many seconds")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    proxy = FaultProxy((host, int(port)), args.port, lifetime=args.lifetime)
    proxy.add(*(_fault_from_text(text) for text in args.fault))
    proxy.start()
    assert proxy._thread is not None
    proxy._thread.join()
    for item in proxy.fired:
        print(f"fired {item.kind} {item.method} {item.target}")


if __name__ == "__main__":
    main()
