"""A fake package index: a recording host (support.host.Host, on 127.0.0.x) that serves `FakeIndex.routes` and answers range requests the way the public index's file host does (run.packages.index
reads wheels only through them). Pages are PEP 691 JSON (`json_page`) or PEP 503 HTML (`html_page`); a fault is
a route with any status, or `no_ranges` (a host that ignores Range and sends the whole file)."""
from __future__ import annotations

import html
import io
import json
import zipfile

from support.host import Answer, Host, Seen

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class FakeIndex:
    """Serves `routes`: path -> (status, content type, body[, headers]); honours `Range: bytes=` unless
    `no_ranges`; records each request's path and Authorization header. The state is the class's (one index a
    session, reset by each test); a subclass with its own class attributes is a second index."""

    routes: dict[str, tuple] = {}
    no_ranges = False
    requests: list[str] = []  # paths asked for, in order
    authorizations: list[str | None] = []  # the Authorization header of each request, in order

    @classmethod
    def reset(cls) -> None:
        """Serve nothing, honour ranges, forget what was asked."""
        cls.routes, cls.no_ranges, cls.requests, cls.authorizations = {}, False, [], []

    @classmethod
    def host(cls, address: str = "127.0.0.1") -> Host:
        """A recording host on `address` that is this index (start it, or use it as a context manager)."""
        return Host(address, route=cls.answer)

    @classmethod
    def answer(cls, seen: Seen) -> Answer:
        cls.requests.append(seen.path)
        cls.authorizations.append(seen.authorization)
        status, kind, body, *headers = cls.routes.get(seen.path, (404, "text/plain", b"not found"))
        extra = {"Content-Type": kind, **(headers[0] if headers else {})}
        wanted = seen.headers.get("range")
        if wanted and status == 200 and not cls.no_ranges:
            start_text, _, end_text = wanted.split("=", 1)[1].partition("-")
            if not start_text:  # a suffix: the last N bytes
                start, end = max(len(body) - int(end_text), 0), len(body) - 1
            else:
                start, end = int(start_text), min(int(end_text), len(body) - 1)
            extra["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            return 206, extra, body[start:end + 1]
        return status, extra, body


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
