"""A recording host: a real threaded HTTP server on a loopback address that answers each request with what a
test scripts and records every request it got, so a test can assert where a credential went and where not.

Different loopback addresses (127.0.0.1, 127.0.0.2, ..., ::1) are different hosts to a client, which is what
the credential-policy tests need. Only loopback addresses are accepted: a fake must never listen on a network.
Every wait is bounded: the serving thread is a daemon, a stall ends after at most MAX_STALL seconds or when the
host closes, and `close()` is safe to call twice."""
from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    import requests

Answer = tuple[int, dict[str, str], bytes]  # status, headers, body
MAX_STALL = 20.0  # seconds: the longest a Stalled answer waits, whatever a test asks


@dataclass(frozen=True)
class Seen:
    """One request a host got; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass(frozen=True)
class Truncated:
    """Answer `answer`'s status and headers with the full Content-Length, send only `keep` bytes of the body,
    then hang up: a connection cut in the middle of a body."""

    answer: Answer
    keep: int


@dataclass(frozen=True)
class Stalled:
    """Send nothing for `seconds` (at most MAX_STALL, and no longer than the host stays open), then `answer`."""

    seconds: float
    answer: Answer = (200, {}, b"")


Reply = Union[Answer, Truncated, Stalled]
Route = Callable[[Seen], Reply]


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def fixed(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Route:
    """A route that answers every request alike."""
    return lambda seen: (status, dict(headers or {}), body)


# The answer headers a front passes back: what registry clients read (the rest is the front's own business).
PASSED_BACK = ("www-authenticate", "docker-content-digest", "content-type", "location",
               "docker-distribution-api-version")


def forward(seen: Seen, base: str, session: "requests.Session") -> Answer:
    """`seen` sent on to `base` (scheme://host:port) as it came — method, path, body and every header but the
    hop's own, Authorization included — and the upstream's answer (status, PASSED_BACK headers, body), for a
    front that stands before a real server. Redirects are the caller's to follow, as a proxy would leave them."""
    headers = {key: value for key, value in seen.headers.items() if key not in ("host", "content-length",
                                                                                 "connection")}
    answer = session.request(seen.method, f"{base}{seen.path}", headers=headers, data=seen.body or None,
                             timeout=30, allow_redirects=False)
    passed = {key: value for key, value in answer.headers.items() if key.lower() in PASSED_BACK}
    return answer.status_code, passed, answer.content


class Host:
    """A recording host on `address` answering with `route` (or a fixed `status`). Use as a context manager or
    call start()/close(); `seen` holds every request in order."""

    def __init__(self, address: str = "127.0.0.1", route: Route | None = None, status: int = 404,
                 context: ssl.SSLContext | None = None) -> None:
        if not (address.startswith("127.") or address == "::1"):
            raise ValueError(f"a fake host listens on loopback only, not {address}")
        self.address, self.context = address, context
        self.route: Route = route or fixed(status)
        self.seen: list[Seen] = []
        self._closed = threading.Event()
        self.httpd: ThreadingHTTPServer | None = None
        self._port = 0  # kept after close: a test may name the host that no longer answers

    # --- life -------------------------------------------------------------------------------------------

    def start(self) -> "Host":
        server = _V6Server if ":" in self.address else ThreadingHTTPServer
        self.httpd = server((self.address, 0), _handler_for(self))
        self._port = self.httpd.server_address[1]
        self.httpd.daemon_threads = True
        if self.context is not None:
            self.httpd.socket = self.context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def __enter__(self) -> "Host":
        return self.start() if self.httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- where it is ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._port, "the host was never started"
        return self._port

    @property
    def host(self) -> str:
        """host:port as a registry reference names it ([::1]:port for IPv6)."""
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{address}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://{self.host}"

    # --- what it got ------------------------------------------------------------------------------------

    def authorizations(self) -> list[str]:
        """The Authorization header of every request that carried one, in order."""
        return [seen.authorization for seen in self.seen if seen.authorization is not None]

    def leaks(self, secrets: tuple[str, ...]) -> list[str]:
        """Every one of `secrets` found anywhere in what this host was sent (path, any header, body)."""
        texts = [seen.path + json.dumps(seen.headers) + seen.body.decode("latin-1") for seen in self.seen]
        return [secret for secret in secrets for text in texts if secret in text]

    def methods(self) -> list[str]:
        return [seen.method for seen in self.seen]

    # --- answering --------------------------------------------------------------------------------------

    def answer(self, seen: Seen) -> Reply:
        """What to send for `seen`; subclasses (the fake registry) answer with more than a route."""
        return self.route(seen)


def _handler_for(owner: Host) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request a connection: a truncated body ends with the connection

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(self.command, self.path, {key.lower(): value for key, value in self.headers.items()},
                        self.rfile.read(length) if length else b"")
            owner.seen.append(seen)
            reply = owner.answer(seen)
            if isinstance(reply, Stalled):
                owner._closed.wait(min(reply.seconds, MAX_STALL))
                reply = reply.answer
            keep = None
            if isinstance(reply, Truncated):
                reply, keep = reply.answer, reply.keep
            status, headers, body = reply
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                with contextlib.suppress(ConnectionError):  # a client that stops reading at its bound hangs up
                    self.wfile.write(body if keep is None else body[:keep])

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    return Handler


def self_signed(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem, valid a day) written into `directory`."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                    "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=directory, check=True, capture_output=True, timeout=60)
    return directory


def server_context(certificate: Path) -> ssl.SSLContext:
    """The server side of TLS with the certificate self_signed wrote into `certificate`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate / "cert.pem", certificate / "key.pem")
    return context
