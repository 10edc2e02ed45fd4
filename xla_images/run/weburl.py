"""One URL, one host: a URL a server answered is parsed once, strictly, and that one parse is what is connected to.

Why: the credential policy judged a URL with urllib.parse while requests/urllib3 connected with their own parser,
and the two disagree on some authorities. `http://evil:1\\@registry:5000/v2/x` is `registry:5000` to urlsplit
(userinfo `evil:1\\`) and `evil:1` to urllib3 (its authority ends at the backslash, as a browser's does), so a
registry's redirect or upload Location of that form kept the Authorization header and sent it to another host.

So every URL a server hands the toolkit (a redirect, an upload Location, a token realm, an index page's link) is
read here into a `WebUrl` — scheme, lower-case host, explicit port, path and query — and refused under
`url-ambiguous`, before any request, when its text holds anything parsers are known to read differently: a
backslash, whitespace or a control character, a character outside ASCII, a `user:password@` part (unless the
caller takes it, as the index URL a site configures), a host that is neither a DNS name, a dotted-quad IPv4 nor
a bracketed IPv6 address (`2130706433`, `127.1`, `0x7f.0.0.1` are numbers a resolver reads as addresses), a
percent sign in the host, or a port that is not a number. Whatever passes has one reading: the policy compares
`origin` of that object, and `send` gives requests the object's canonical `text` and checks that urllib3, on
the request requests prepared from it, reads the same host and port (`connects_to`) before any byte is sent.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urljoin

import requests
from urllib3.util import parse_url

from ..errors import Failure

RULE = "url-ambiguous"
DEFAULT_PORTS = {"http": 80, "https": 443}
# The whole text: visible ASCII only (0x21-0x7E), no backslash. Space, tab, CR/LF, NUL, DEL and non-ASCII are
# where parsers differ (WHATWG strips tabs and newlines, others keep or refuse them; `\\` is `/` to a browser).
_VISIBLE = re.compile(r"[!-\[\]-~]*")
_ABSOLUTE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<path>[^?#]*)"
                       r"(?P<query>\?[^#]*)?(?:#.*)?")
# A DNS name's labels (docker's hosts may hold `_`: compose service names); an optional final dot.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_BYTE = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # decimal, no leading zero
_QUAD = re.compile(rf"{_BYTE}(?:\.{_BYTE}){{3}}")
_USERINFO = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:%-]*")
_PORT = re.compile(r"[0-9]{1,10}")  # leading zeros: both parsers read them as int() does

Origin = tuple[str, str, int]


@dataclass(frozen=True)
class WebUrl:
    """An http(s) URL read one way: what the policy judges and what the connection goes to are this object."""

    scheme: str  # "http" or "https"
    host: str  # lower case; an IPv6 address in brackets, compressed
    port: int  # explicit, the scheme's default filled in
    target: str  # path (at least "/") and query; the fragment is dropped (it is never sent)

    @property
    def origin(self) -> Origin:
        return self.scheme, self.host, self.port

    @property
    def netloc(self) -> str:
        """`HOST[:PORT]` as docker keys a registry: the port only when it is not the scheme's default."""
        return self.host if self.port == DEFAULT_PORTS[self.scheme] else f"{self.host}:{self.port}"

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def text(self) -> str:
        """The canonical text: the one string the request is built from."""
        return f"{self.scheme}://{self.netloc}{self.target}"

    def __str__(self) -> str:
        return self.text

    def join(self, reference: str, *, who: str) -> "WebUrl":
        """The URL `reference` (a Location: absolute, `//host/...`, `/path` or relative) names from this one;
        refused when the reference's own text is ambiguous, whatever joining would make of it."""
        check_text(reference, who)
        try:
            joined = urljoin(self.text, reference)
        except ValueError:  # urlsplit's own refusal: `http://[::1`, `https://[zz]/x`
            raise refusal(who, "a bracketed host that is not a plain IPv6 address") from None
        return parse(joined, who=who)


def refusal(who: str, reason: str) -> Failure:
    # The URL itself is not shown: it may hold a user:password part or bytes a terminal would interpret.
    return Failure(f"{who} answered a URL whose host is ambiguous ({reason}): refused before any request",
                   rule=RULE, hint=f"parsers disagree on such a URL, so no credential may follow it; check {who} "
                                   "(or the proxy before it), which must answer plain http(s)://HOST[:PORT]/PATH")


def parse(text: str, *, who: str) -> WebUrl:
    """The strict reading of an absolute http(s) URL without a user:password part (see the module docstring)."""
    url, userinfo = parse_with_userinfo(text, who=who)
    if userinfo is not None:
        raise refusal(who, "a user:password@ part")
    return url


def parse_with_userinfo(text: str, *, who: str) -> tuple[WebUrl, tuple[str, str] | None]:
    """`parse`, taking a `user:password@` part apart (a configured index URL carries its credentials so): the
    URL without it, and the (user, password) pair, or None."""
    check_text(text, who)
    match = _ABSOLUTE.fullmatch(text)
    if match is None:
        raise refusal(who, "not an absolute URL")
    scheme = match["scheme"].lower()
    if scheme not in DEFAULT_PORTS:
        raise refusal(who, "not http(s)")
    userinfo, at, hostport = match["authority"].rpartition("@")
    credentials = None
    if at:
        if "@" in userinfo or not _USERINFO.fullmatch(userinfo):
            raise refusal(who, "an `@` or another character parsers split differently in a user:password@ part")
        user, _, password = userinfo.partition(":")
        credentials = (unquote(user), unquote(password))
    host, port = _host_and_port(hostport, scheme, who)
    # The path starts with "/" or is empty (the authority ends at the first "/", "?" or "#").
    return WebUrl(scheme, host, port, (match["path"] or "/") + (match["query"] or "")), credentials


def check_text(text: str, who: str) -> None:
    """Refuse a URL or reference whose text holds what parsers read differently (before any joining)."""
    if not isinstance(text, str) or not text:
        raise refusal(who, "an empty URL")
    if _VISIBLE.fullmatch(text) is None:
        bad = next(char for char in text if not _VISIBLE.fullmatch(char))
        reason = ("a backslash" if bad == "\\" else "a character outside ASCII" if ord(bad) > 0x7F
                  else "whitespace or a control character")
        raise refusal(who, reason)


def _host_and_port(hostport: str, scheme: str, who: str) -> tuple[str, int]:
    if hostport.startswith("["):
        address, bracket, rest = hostport[1:].partition("]")
        try:
            if not bracket or "%" in address:  # `[::1` unclosed; a zone id (`%25eth0`) IPv6Address would take
                raise ValueError(address)
            host = f"[{ipaddress.IPv6Address(address).compressed}]"
        except ValueError:  # a zone id (`%25eth0`), an IPv4 in brackets, garbage
            raise refusal(who, "a bracketed host that is not a plain IPv6 address") from None
    else:
        name, colon, port_text = hostport.partition(":")
        host, rest = name.lower(), colon + port_text
        _check_name(host, who)
    if not rest:
        return host, DEFAULT_PORTS[scheme]
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or not 0 < int(rest[1:]) < 65536:
        raise refusal(who, "a port that is not a number from 1 to 65535")
    return host, int(rest[1:])


def _check_name(host: str, who: str) -> None:
    if not host:
        raise refusal(who, "no host")
    if "%" in host:
        raise refusal(who, "a percent sign in the host")
    if not _NAME.fullmatch(host) or len(host) > 254:
        raise refusal(who, "a host that is no DNS name, IPv4 or [IPv6] address")
    last = host.rstrip(".").rpartition(".")[2]
    # A name whose last label is a number is an address to a resolver (inet_aton reads `2130706433`, `127.1`,
    # `0177.0.0.1`, `0x7f.1` as 127.0.0.1): only the canonical dotted quad is taken, without a final dot.
    if (last.isdigit() or last.startswith("0x")) and not _QUAD.fullmatch(host):
        raise refusal(who, "a host that is a number or an IPv4 address not written as four decimal bytes")


def connects_to(prepared_url: str) -> tuple[str, int]:
    """(host, port) urllib3 connects to for the URL requests prepared: the check that it is the one judged."""
    parsed = parse_url(prepared_url)
    scheme = (parsed.scheme or "").lower()
    return (parsed.host or "").lower(), parsed.port or DEFAULT_PORTS.get(scheme, -1)


def send(session: requests.Session, method: str, url: WebUrl, *, who: str, **kwargs: Any) -> requests.Response:
    """One request to exactly `url`, never following a redirect (the caller judges each hop): requests is given
    the canonical text, and the URL requests prepares from it (its own prepare_url, the one Session.request runs,
    with the query `params` adds) must connect to the host and port the caller judged, or nothing is sent."""
    prepared = requests.Request(method, url.text, params=kwargs.get("params")).prepare()
    if connects_to(str(prepared.url)) != (url.host, url.port):
        raise refusal(who, "a URL the HTTP library reads as another host")
    try:
        return session.request(method, url.text, allow_redirects=False, **kwargs)
    except UnicodeDecodeError:  # requests decodes a redirect's Location as UTF-8 even when it does not follow it
        raise refusal(who, "a character outside ASCII") from None
    except ValueError as error:  # ... and prepares it (Response.next): `http://[::1`, `https://[zz]/x` fail there
        if isinstance(error, requests.RequestException):  # InvalidURL and the like: the caller classifies them
            raise
        raise refusal(who, "a bracketed host that is not a plain IPv6 address") from None
