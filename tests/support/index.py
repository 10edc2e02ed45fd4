"""A fake package index: a stdlib HTTP handler (serve it with support.host.serving on 127.0.0.x) that serves
`FakeIndex.routes` and answers range requests the way the public index's file host does (run.packages.index
reads wheels only through them). Pages are PEP 691 JSON (`json_page`) or PEP 503 HTML (`html_page`); a fault is
a route with any status, or `no_ranges` (a host that ignores Range and sends the whole file)."""
from __future__ import annotations

import contextlib
import html
import http.server
import io
import json
import zipfile

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class FakeIndex(http.server.BaseHTTPRequestHandler):
    """Serves `routes`: path -> (status, content type, body[, headers]); honours `Range: bytes=` unless
    `no_ranges`; records each request's path and Authorization header."""

    routes: dict[str, tuple[int, str, bytes]] = {}
    no_ranges = False
    requests: list[str] = []  # paths asked for, in order
    authorizations: list[str | None] = []  # the Authorization header of each request, in order

    @classmethod
    def reset(cls) -> None:
        """Serve nothing, honour ranges, forget what was asked (state is the class's: one index a session)."""
        cls.routes, cls.no_ranges, cls.requests, cls.authorizations = {}, False, [], []

    def do_GET(self) -> None:  # noqa: N802 -- the http.server API
        type(self).requests.append(self.path)
        type(self).authorizations.append(self.headers.get("Authorization"))
        status, kind, body, *headers = self.routes.get(self.path, (404, "text/plain", b"not found"))
        wanted = self.headers.get("Range")
        if wanted and status == 200 and not self.no_ranges:
            spec = wanted.split("=", 1)[1]
            start_text, _, end_text = spec.partition("-")
            if not start_text:
                start, end = max(len(body) - int(end_text), 0), len(body) - 1
            else:
                start, end = int(start_text), min(int(end_text), len(body) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
            body = body[start:end + 1]
        else:
            self.send_response(status)
        self.send_header("Content-Type", kind)
        for name, value in (headers[0] if headers else {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # a client that stops reading at its bound hangs up
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def json_page(files: list[dict]) -> tuple[int, str, bytes]:
    """A PEP 691 project page listing `files` ({filename, url[, yanked, size]}), as a route."""
    return 200, JSON_TYPE, json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()


def html_page(files: list[dict]) -> tuple[int, str, bytes]:
    """A PEP 503 project page listing `files` ({filename, url[, yanked]}), as a route."""
    links = "".join(f'<a href="{html.escape(f["url"])}"' + (' data-yanked=""' if f.get("yanked") else "")
                    + f'>{html.escape(f["filename"])}</a>\n' for f in files)
    return 200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()


def wheel(members: dict[str, str]) -> bytes:
    """A deflated zip holding `members` (name -> text): a wheel as far as run.packages.index reads one."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return buffer.getvalue()
