"""Reading a package index: which wheels exist, and a wheel's METADATA without downloading the wheel.

`build.py update` asks the index of the site's wheel source (the public index unless a site says otherwise)
what torch_xla releases exist and what each pins. How, and why:
* the simple API (PEP 503/691): JSON when the index serves it (`Accept: application/vnd.pypi.simple.v1+json`),
  the HTML page otherwise. The legacy per-project JSON API is not used (the public index answers 404 for it).
* torch_xla's files carry no separate metadata file (PEP 658), and its wheels are ~80 MB (torch's ~900 MB):
  METADATA is read from the wheel itself with HTTP range requests — the zip's end record and central directory
  from the file's tail, then the one compressed member — a few hundred KB per wheel.
* every answer is checked before use (content type, JSON shape, sizes, zip records), and every problem is a
  Failure naming the URL and the rule: `index-network` (unreachable after retries), `index-answer` (an answer
  of the wrong shape or size), `wheel-metadata` (a wheel whose zip or METADATA cannot be read), `index-slow`
  (an exchange past its deadline).
* every read ends (run.netread): each exchange, retries included, within REQUEST_SECONDS, and all of one
  Index's within COMMAND_SECONDS, the deadline biting at the socket (a server dribbling a byte every 25 s is
  cut when the time is up); every body is bounded as it streams (a page by MAX_PAGE_BYTES, a range by its size).
* credentials in the index URL (`https://user:secret@host/simple/`) go to that index as basic auth, and are
  dropped at a redirect to another host; redirects are followed here, each hop one strict reading of its URL
  (run.weburl: a Location or link that could name two hosts is refused under `url-ambiguous` before any
  request); every message names the URL redacted.
"""
from __future__ import annotations

import contextlib
import email.parser
import html.parser
import re
import struct
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import requests
import tenacity

from ...errors import Failure, redacted, shorten, shown_value
from ...model.wheel_index import PUBLIC_INDEX
from .. import netread, weburl
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
# A project page of the public index: torch's lists ~1000 files in ~420 KB (JSON, 2026-12). Far more is not an
# index page, and a page is parsed only once it is whole: the byte bound is what bounds the parse's memory (JSON
# takes ~20 times its size in objects), so it is 20 times torch's page, not more.
MAX_PAGE_BYTES = 8 * 1024 * 1024
MAX_FILES = 50_000
# The tail read first holds the zip's end records and, for wheels like torch_xla's, the whole central directory.
TAIL_BYTES = 256 * 1024
MAX_CENTRAL_DIRECTORY = 16 * 1024 * 1024
MAX_MEMBER_BYTES = 4 * 1024 * 1024  # a METADATA or version.py, compressed or not
TIMEOUT = (10, 60)  # connect, read (seconds): each socket read; the deadlines below bound the whole
# One exchange (a page or a range, with its retries): the public index answers in under a second.
REQUEST_SECONDS = 120.0
# Everything one Index reads (one `update`: 3 pages and 2-4 ranges per release, ~1 s per release measured).
COMMAND_SECONDS = 600.0
ATTEMPTS = 4
MAX_REDIRECTS = 10  # as the registry client's (Go's defaultCheckRedirect)
WHEEL_NAME = re.compile(r"(?P<name>[^-/]+)-(?P<version>[^-/]+)(-\d[^-/]*)?-(?P<python>[^-/]+)-(?P<abi>[^-/]+)"
                        r"-(?P<platform>[^-/]+)\.whl")
END_RECORD = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP64_END = b"PK\x06\x06"
CENTRAL_ENTRY = b"PK\x01\x02"
LOCAL_HEADER = b"PK\x03\x04"


@dataclass(frozen=True)
class IndexFile:
    """One file a project page lists."""

    filename: str
    url: str
    size: int | None = None
    # PEP 592: the index withdrew this file (pip skips it unless pinned exactly). `update` never proposes it.
    yanked: bool = False

    @property
    def wheel(self) -> re.Match[str] | None:
        return WHEEL_NAME.fullmatch(self.filename)


class NotFound(Failure):
    """The index answered 404: it has no such project page (or file). A Failure like any other answer of the wrong
    kind (`index-answer`), which a caller may tell apart: `update` records no companion an index does not have."""


class _Transient(Exception):
    """A failure worth retrying: no connection, a timeout, a 5xx or 429."""


@dataclass
class Index:
    """One simple-API index. `session` is a requests.Session; tests of error paths may pass their own."""

    url: str = PUBLIC_INDEX
    ca_bundle: str | None = None
    session: Any = None
    attempts: int = ATTEMPTS
    first_wait: float = 1.0
    request_seconds: float = REQUEST_SECONDS
    command_seconds: float = COMMAND_SECONDS
    # Bytes of answers read so far (benchmarks/bench_update.py prints it: range requests keep it small).
    received: int = 0
    # url -> central directory: reading METADATA and then version.py of one wheel reads its tail once.
    _directories: dict[str, bytes] = field(default_factory=dict)
    # When the first exchange began: COMMAND_SECONDS count from there.
    _started: float | None = None

    def __post_init__(self) -> None:
        if not self.url.endswith("/"):
            self.url += "/"
        if self.session is None:
            self.session = requests.Session()
            self.session.headers["User-Agent"] = "xla-images update"
            for scheme in ("http://", "https://"):  # socket reads that end at the deadline in force
                self.session.mount(scheme, netread.DeadlineAdapter())
        if self.ca_bundle:
            self.session.verify = self.ca_bundle

    @contextlib.contextmanager
    def _exchange(self, url: str, what: str) -> Iterator[None]:
        """The block of one exchange with `url`: it ends within request_seconds, and within what is left of
        command_seconds; past either, a Failure `index-slow` naming the host (never its credentials)."""
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        left = self.command_seconds - (now - self._started)
        host = _host(url)
        if left <= 0:
            raise self._command_failure(host)
        try:
            with netread.deadline(min(self.request_seconds, left), host=host, what=what, rule="index-slow"):
                yield
        except Failure as error:
            if error.rule == "index-slow" and left < self.request_seconds:
                raise self._command_failure(host) from None
            raise

    def _command_failure(self, host: str) -> Failure:
        return Failure(f"{host}: reading the index did not finish within {self.command_seconds:g} s (the "
                       "deadline of all of one command's reads)", rule="index-slow",
                       hint="the index answers too slowly (or dribbles its answers); try again later, or check "
                            "the network and any proxy in between")

    # --- the simple API -------------------------------------------------------------------------------------

    def files(self, project: str) -> list[IndexFile]:
        """Every file the project's page lists (JSON form where served, HTML otherwise)."""
        page = urllib.parse.urljoin(self.url, f"{project}/")
        with self._exchange(page, f"the {project} page"):
            response = self._get(page, {"Accept": ACCEPT})
            body = _bounded_body(response, page, MAX_PAGE_BYTES)
        self.received += len(body)
        kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind == JSON_TYPE:
            files = _json_files(body, page)
        elif kind in ("text/html", "application/vnd.pypi.simple.v1+html", ""):
            files = _html_files(body, page)
        else:
            raise Failure(f"{page} answered {shown_value(kind)}, not a simple-API page", location=page,
                          rule="index-answer", hint="is the wheel source's index_url a PEP 503 simple index?")
        if len(files) > MAX_FILES:
            raise Failure(f"{page} lists {len(files)} files, more than {MAX_FILES}", location=page,
                          rule="index-answer")
        return files

    # --- one member of a remote wheel -----------------------------------------------------------------------

    def wheel_member(self, file: IndexFile, wanted: Callable[[str], bool]) -> str | None:
        """The text of the first member of the wheel whose name `wanted` accepts (None: no such member).

        Reads the zip's tail, then the central directory if it did not fit, then the member: range requests only.
        """
        directory = self._directories.get(file.url)
        if directory is None:
            tail, size = self._tail(file)
            directory = _central_directory(tail, size, file.url,
                                           lambda start, end: self._range(file.url, start, end))
            self._directories[file.url] = directory
        for name, method, compressed, plain, offset in _entries(directory, file.url):
            if not wanted(name):
                continue
            if compressed > MAX_MEMBER_BYTES or plain > MAX_MEMBER_BYTES:
                raise _bad(file.url, f"{name} is {max(compressed, plain)} bytes, more than {MAX_MEMBER_BYTES}")
            # The local header has its own name and extra field lengths: read it with some slack, then the data.
            head = self._range(file.url, offset, offset + 30 + 4096 + compressed)
            if head[:4] != LOCAL_HEADER or len(head) < 30:
                raise _bad(file.url, f"no whole local header for {name} at offset {offset}")
            name_length, extra_length = struct.unpack("<HH", head[26:30])
            start = 30 + name_length + extra_length
            data = head[start:start + compressed]
            if len(data) < compressed:
                data += self._range(file.url, offset + start + len(data), offset + start + compressed)
            if len(data) != compressed:  # the file ends inside the member: a cut wheel
                raise _bad(file.url, f"{name} is cut: {len(data)} of its {compressed} bytes are there")
            return _inflate(data, method, plain, name, file.url)
        return None

    def _tail(self, file: IndexFile) -> tuple[bytes, int]:
        with self._exchange(file.url, f"the last {TAIL_BYTES} bytes of {file.filename}"):
            response = self._get(file.url, {"Range": f"bytes=-{TAIL_BYTES}"})
            if response.status_code != 206:
                response.close()
                raise Failure(f"{file.url} answered {response.status_code} to a range request", location=file.url,
                              rule="index-answer", hint="the wheels' host must serve HTTP range requests (the "
                                                        "public index does); whole wheels are not downloaded to "
                                                        "read METADATA")
            body = _bounded_body(response, file.url, TAIL_BYTES)
        self.received += len(body)
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", response.headers.get("Content-Range", ""))
        if match is None or int(match[2]) - int(match[1]) + 1 != len(body) or int(match[2]) + 1 != int(match[3]):
            raise _bad(file.url, f"Content-Range {shown_value(response.headers.get('Content-Range'))} does not "
                                 f"describe the {len(body)}-byte tail it came with")
        return body, int(match[3])

    def _range(self, url: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `url`."""
        with self._exchange(url, f"bytes {start}-{end - 1} of {url.rsplit('/', 1)[-1]}"):
            response = self._get(url, {"Range": f"bytes={start}-{end - 1}"})
            if response.status_code != 206:
                response.close()
                raise Failure(f"{url} answered {response.status_code} to a range request", location=url,
                              rule="index-answer")
            body = _bounded_body(response, url, end - start)
        self.received += len(body)
        if not body:  # shorter is fine: a read with slack may run past the end of the file
            raise _bad(url, f"an empty answer for bytes {start}-{end - 1}")
        return body

    # --- HTTP -------------------------------------------------------------------------------------------------

    def _get(self, url: str, headers: dict[str, str]) -> requests.Response:
        if not url.startswith(("https://", "http://")):
            raise Failure(f"refusing to fetch {shown_value(url)}: not an http(s) URL", location=url,
                          rule="index-answer")
        backoff = tenacity.wait_exponential(multiplier=self.first_wait, max=20)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=lambda state: _within_deadline(backoff(state)),
            retry=tenacity.retry_if_exception_type(_Transient), reraise=True)
        try:
            return retrying(self._get_once, url, headers)
        except _Transient as error:
            raise Failure(f"cannot read {url}: {error}", location=url, rule="index-network",
                          hint="check the network (and, behind a TLS-intercepting proxy, the site's ca_bundle: "
                               "--set ca_bundle=/etc/ssl/certs/ca-certificates.crt)") from None

    def _get_once(self, url: str, headers: dict[str, str]) -> requests.Response:
        try:
            response = self._follow(url, headers)
        except requests.exceptions.SSLError as error:
            raise Failure(f"TLS to {url} failed: {shorten(str(error), 200)}", location=url, rule="index-network",
                          hint="behind a TLS-intercepting proxy, point the site's ca_bundle at the proxy's CA "
                               "(--set ca_bundle=FILE)") from None
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as error:
            raise _Transient(shorten(str(error), 200)) from None
        except requests.exceptions.RequestException as error:
            raise Failure(f"cannot read {url}: {shorten(str(error), 200)}", location=url,
                          rule="index-network") from None
        if response.status_code == 429 or response.status_code >= 500:
            response.close()
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code not in (200, 206):
            response.close()
            kind = NotFound if response.status_code == 404 else Failure
            raise kind(f"{url} answered HTTP {response.status_code}", location=url, rule="index-answer",
                          hint="is the project name right, and the wheel source's index_url a simple index?")
        return response


    def _configured(self, who: str) -> tuple[weburl.Origin, tuple[str, str] | None]:
        """The configured index URL's origin and user:password: the only credentials a URL here may carry."""
        url, auth = weburl.parse_with_userinfo(self.url, who=who)
        return url.origin, auth

    def _follow(self, url: str, headers: dict[str, str]) -> requests.Response:
        """GET `url`, redirects followed here, not by requests (whose should_strip_auth read a Location with
        urlparse while urllib3 connected elsewhere): each hop is one strict WebUrl (run.weburl), refused under
        `url-ambiguous` when it could name two hosts; the index URL's user:password goes as basic auth to the
        first URL's origin only, never past a hop that leaves it."""
        who = f"the index {_host(self.url)}"
        current, auth = weburl.parse_with_userinfo(url, who=who)
        if auth is not None and (current.origin, auth) != self._configured(who):
            raise weburl.refusal(who, "a user:password@ part the index URL does not hold")
        start = current
        for hops in range(MAX_REDIRECTS + 1):
            response = weburl.send(self.session, "GET", current, who=who, headers=headers, auth=auth,
                                   timeout=TIMEOUT, stream=True)
            location = response.headers.get("Location")
            if response.status_code not in (301, 302, 303, 307, 308) or not location:
                return response
            response.close()
            if hops == MAX_REDIRECTS:
                break
            current = current.join(location, who=who)
            if current.origin != start.origin:
                auth = None
        raise Failure(f"{url} redirected more than {MAX_REDIRECTS} times", location=url, rule="index-answer",
                      hint="the index (or the proxy before it) redirects in a loop")


# --- answers ------------------------------------------------------------------------------------------------

def _within_deadline(seconds: float) -> float:
    """A retry's wait, cut to what is left of the deadline in force (the next attempt then fails at once)."""
    now = netread.current()
    return seconds if now is None else max(min(seconds, now.remaining()), 0.0)


def _host(url: str) -> str:
    """`host[:port]` of `url`, without the credentials a URL may carry."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number: the whole netloc, redacted
        return redacted(f"{parts.scheme}://{parts.netloc}")
    return f"{parts.hostname or ''}{port}"


def _bounded_body(response: requests.Response, url: str, limit: int) -> bytes:
    """The body, refused once it passes `limit` bytes (a wrong URL must not fill the memory): a declared
    Content-Length over it before a byte is read, a stream as it grows. A cut or broken body: a Failure."""
    path = urllib.parse.urlsplit(url).path
    return netread.read_body(response, limit, host=_host(url), what=f"GET {path}", rule="index-answer")


def _shown_json(value: Any) -> str:
    """A JSON value for a message: an integer of 5000 digits has no repr (int_max_str_digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "an integer of more than 64 bits"
    return shown_value(value)


def _json_files(body: bytes, page: str) -> list[IndexFile]:
    import json

    if body.count(b'"filename"') > MAX_FILES:  # counted before parsing: the parse is what costs the memory
        raise Failure(f"{page} lists more than {MAX_FILES} files", location=page, rule="index-answer")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Failure(f"{page} is not JSON although it says so", location=page, rule="index-answer") from None
    except RecursionError:  # `[[[[...` nested deeper than the parser recurses: no index page is
        raise Failure(f"{page} is JSON nested too deep to be a simple-API page", location=page,
                      rule="index-answer") from None
    files = data.get("files") if isinstance(data, dict) else None
    meta = data.get("meta") if isinstance(data, dict) else None
    version = meta.get("api-version") if isinstance(meta, dict) else "1.0"
    if not isinstance(version, str) or version.split(".")[0] != "1":
        # PEP 691: a client must refuse a major version it does not know.
        raise Failure(f"{page} speaks simple API version {shown_value(version)}, not 1.x", location=page,
                      rule="index-answer")
    if not isinstance(files, list):
        raise Failure(f"{page} has no `files` list (PEP 691)", location=page, rule="index-answer")
    result = []
    for index, entry in enumerate(files):
        if not (isinstance(entry, dict) and isinstance(entry.get("filename"), str)
                and isinstance(entry.get("url"), str)):
            raise Failure(f"{page}: files[{index}] is not a {{filename, url}} object", location=page,
                          rule="index-answer")
        size = entry.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise Failure(f"{page}: files[{index}].size is {_shown_json(size)}", location=page,
                          rule="index-answer")
        yanked = entry.get("yanked", False)
        if not isinstance(yanked, (bool, str)):  # PEP 691: false, true or the reason (a string)
            raise Failure(f"{page}: files[{index}].yanked is {_shown_json(yanked)}, not a boolean or a reason",
                          location=page, rule="index-answer")
        result.append(_file(entry["filename"], entry["url"], page, size, yanked is not False))
    return result


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, bool]] = []
        self._href: str | None = None
        self._yanked = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            found = dict(attrs)
            self._href = found.get("href") or ""
            self._yanked = "data-yanked" in found  # PEP 592: present (with a reason or empty) means yanked
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip(), self._yanked))
            self._href = None
            if len(self.links) > MAX_FILES:  # while parsing: the count bounds what is built
                raise _TooMany()


class _TooMany(Exception):
    """More links than MAX_FILES: parsing stops there."""


def _html_files(body: bytes, page: str) -> list[IndexFile]:
    parser = _Links()
    try:
        parser.feed(body.decode("utf-8"))
        parser.close()
    except UnicodeDecodeError:
        raise Failure(f"{page} is not UTF-8 HTML", location=page, rule="index-answer") from None
    except _TooMany:
        raise Failure(f"{page} lists more than {MAX_FILES} files", location=page, rule="index-answer") from None
    return [_file(text or href.rsplit("/", 1)[-1].split("#")[0], href, page, None, yanked)
            for href, text, yanked in parser.links]


def _file(filename: str, url: str, page: str, size: int | None, yanked: bool = False) -> IndexFile:
    if len(filename) > 400 or "/" in filename or any(ord(char) < 32 for char in filename):
        raise Failure(f"{page} lists a file named {shown_value(filename)}", location=page, rule="index-answer")
    # The link's own text first: urljoin silently drops a tab or newline (and keeps a backslash) that another
    # parser reads otherwise (run.weburl).
    weburl.check_text(url, f"the index page {_host(page)}")
    absolute = urllib.parse.urljoin(page, url).split("#")[0]
    return IndexFile(urllib.parse.unquote(filename), absolute, size, yanked)


# --- the zip format (APPNOTE.TXT), as far as reading one member needs ------------------------------------------

def _bad(url: str, detail: str) -> Failure:
    return Failure(f"cannot read the wheel {url}: {detail}", location=url, rule="wheel-metadata",
                   hint="the index serves a damaged or unusual wheel; report it upstream, or pin another release "
                        "with --release")


def _central_directory(tail: bytes, size: int, url: str, fetch: Callable[[int, int], bytes]) -> bytes:
    at = tail.rfind(END_RECORD)
    if at < 0 or len(tail) - at < 22:
        raise _bad(url, "no zip end record in its last bytes")
    entries, length, offset = struct.unpack("<xxxxxxxxxxHII", tail[at:at + 20])[0:3]
    if offset == 0xFFFFFFFF or length == 0xFFFFFFFF:  # zip64: the real figures are in the zip64 end record
        locator = tail.rfind(ZIP64_LOCATOR, 0, at)
        if locator < 0 or at - locator < 20:  # the locator is 20 bytes, right before the end record
            raise _bad(url, "a zip64 wheel without a whole zip64 locator")
        (end64,) = struct.unpack("<Q", tail[locator + 8:locator + 16])
        if end64 + 56 > size:
            raise _bad(url, f"the zip64 end record's offset {end64} lies past the end of the {size}-byte file")
        record = _slice(tail, size, end64, 56, fetch)
        if record[:4] != ZIP64_END or len(record) < 56:
            raise _bad(url, "no whole zip64 end record where its locator says")
        length, offset = struct.unpack("<QQ", record[40:56])
    if length > MAX_CENTRAL_DIRECTORY or offset + length > size:
        raise _bad(url, f"a central directory of {length} bytes at {offset} in a {size}-byte file")
    directory = _slice(tail, size, offset, length, fetch)
    if len(directory) != length:
        raise _bad(url, f"its central directory is cut: {len(directory)} of {length} bytes")
    return directory


def _slice(tail: bytes, size: int, offset: int, length: int, fetch: Callable[[int, int], bytes]) -> bytes:
    """Bytes [offset, offset+length) of the file: from the tail already read when they are in it."""
    tail_start = size - len(tail)
    if offset >= tail_start:
        return tail[offset - tail_start:offset - tail_start + length]
    return fetch(offset, offset + length)


def _entries(directory: bytes, url: str):
    """(name, method, compressed size, size, local header offset) of each central directory entry."""
    at = 0
    while at + 46 <= len(directory) and directory[at:at + 4] == CENTRAL_ENTRY:
        method, = struct.unpack("<H", directory[at + 10:at + 12])
        compressed, plain, name_length, extra_length, comment_length = struct.unpack(
            "<IIHHH", directory[at + 20:at + 34])
        offset, = struct.unpack("<I", directory[at + 42:at + 46])
        if at + 46 + name_length + extra_length > len(directory):
            raise _bad(url, f"its central directory entry at {at} is cut")
        name = directory[at + 46:at + 46 + name_length].decode("utf-8", "replace")
        extra = directory[at + 46 + name_length:at + 46 + name_length + extra_length]
        compressed, plain, offset = _zip64_sizes(extra, compressed, plain, offset, url)
        yield name, method, compressed, plain, offset
        at += 46 + name_length + extra_length + comment_length
    if at == 0:
        raise _bad(url, "its central directory holds no entries")


def _zip64_sizes(extra: bytes, compressed: int, plain: int, offset: int, url: str) -> tuple[int, int, int]:
    """Sizes and offset that did not fit 32 bits live, in this order, in the zip64 extra field (id 1)."""
    at = 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack("<HH", extra[at:at + 4])
        if at + 4 + length > len(extra):
            raise _bad(url, f"an extra field of {length} bytes runs past its central directory entry")
        if kind == 1:
            values = list(struct.unpack(f"<{length // 8}Q", extra[at + 4:at + 4 + length - length % 8]))
            if plain == 0xFFFFFFFF and values:
                plain = values.pop(0)
            if compressed == 0xFFFFFFFF and values:
                compressed = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
        at += 4 + length
    return compressed, plain, offset


def _inflate(data: bytes, method: int, plain: int, name: str, url: str) -> str:
    try:
        if method == 0:
            raw = data
        elif method == 8:
            raw = zlib.decompressobj(-15).decompress(data, MAX_MEMBER_BYTES + 1)
        else:
            raise _bad(url, f"{name} is stored with zip method {method} (only stored and deflated are read)")
    except zlib.error as error:
        raise _bad(url, f"{name} does not inflate: {error}") from None
    if len(raw) != plain:
        raise _bad(url, f"{name} inflates to {len(raw)} bytes, its directory entry says {plain}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(url, f"{name} is not UTF-8") from None


def parse_metadata(text: str) -> email.message.Message:
    """A METADATA file (RFC 822 headers); Requires-Dist and Provides-Extra may repeat."""
    return email.parser.HeaderParser().parsestr(text)
