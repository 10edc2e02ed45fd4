"""run/weburl.py: one strict reading of a URL a server answered, the one both the policy and the connection use.

The table holds the forms parsers are known to read differently (refused) and the forms they agree on (read
one way, canonical text). The property test throws strings built from the characters those forms use at the
parser: whatever it accepts, urlsplit (what the policy once used) and urllib3 (what requests connects with)
read the canonical text as the same host and port the object holds.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
from hypothesis import given, settings, strategies as st
from urllib3.util import parse_url

from xla_images.errors import Failure
from xla_images.run import weburl

WHO = "registry r.example:5000"

REFUSED = {
    "backslash-in-authority": ("http://localhost:18701\\@127.0.0.1:18700/v2/x", "a backslash"),
    "backslash-in-path": ("http://127.0.0.1:1/\\evil/x", "a backslash"),
    "percent-5c-userinfo": ("http://localhost:18701%5C@127.0.0.1:18700/v2/x", "user:password"),
    "tab": ("http://a\t@127.0.0.1/", "whitespace or a control character"),
    "cr-lf": ("http://127.0.0.1/x\r\nHost: evil", "whitespace or a control character"),
    "lf-in-host": ("http://evil\n.127.0.0.1/", "whitespace or a control character"),
    "nul": ("http://evil\x00.example/", "whitespace or a control character"),
    "del": ("http://evil\x7f.example/", "whitespace or a control character"),
    "space": ("http://evil @127.0.0.1/", "whitespace or a control character"),
    "raw-non-ascii": ("http://evil\u00e9@127.0.0.1/", "outside ASCII"),
    "fullwidth-dot": ("http://evil\uff0eexample/", "outside ASCII"),
    "userinfo": ("http://user:pw@127.0.0.1/", "user:password"),
    "two-ats": ("http://a@b@127.0.0.1/", "`@`"),
    "integer-ip": ("http://2130706433/", "a number"),
    "short-ip": ("http://127.1:5000/", "a number"),
    "octal-ip": ("http://0177.0.0.1/", "a number"),
    "hex-ip": ("http://0x7f.0.0.1/", "a number"),
    "trailing-dot-ip": ("http://127.0.0.1./", "a number"),
    "percent-in-host": ("http://evil%2eexample/", "percent"),
    "zone-id": ("http://[fe80::1%25eth0]/", "IPv6"),
    "ipv4-in-brackets": ("http://[127.0.0.1]/", "IPv6"),
    "open-bracket": ("http://[::1/", "IPv6"),
    "port-zero": ("http://h.example:0/", "port"),
    "port-too-big": ("http://h.example:65536/", "port"),
    "port-empty": ("http://h.example:/", "port"),
    "port-not-a-number": ("http://h.example:8o/", "port"),
    "ftp": ("ftp://h.example/x", "not http(s)"),
    "relative": ("/v2/x", "not an absolute URL"),
    "empty-host": ("http:///x", "no host"),
    "underscore-only-hyphen": ("http://-evil.example/", "no DNS name"),
}

ACCEPTED = {
    "plain": ("http://127.0.0.1:5000/v2/x?n=1", ("http", "127.0.0.1", 5000), "http://127.0.0.1:5000/v2/x?n=1"),
    "default-port": ("https://R.Example:443/v2/", ("https", "r.example", 443), "https://r.example/v2/"),
    "scheme-case": ("HTTP://r.example/v2/", ("http", "r.example", 80), "http://r.example/v2/"),
    "leading-zero-port": ("http://r.example:05000/", ("http", "r.example", 5000), "http://r.example:5000/"),
    "trailing-dot-name": ("http://r.example./x", ("http", "r.example.", 80), "http://r.example./x"),
    "ipv6": ("http://[0:0::1]:5000/x", ("http", "[::1]", 5000), "http://[::1]:5000/x"),
    "fragment-then-at": ("http://evil.example#@r.example/", ("http", "evil.example", 80), "http://evil.example/"),
    "query-then-at": ("http://evil.example?@r.example/", ("http", "evil.example", 80),
                      "http://evil.example/?@r.example/"),
    "no-path": ("https://r.example", ("https", "r.example", 443), "https://r.example/"),
    "underscore": ("http://my_registry:5000/v2/", ("http", "my_registry", 5000), "http://my_registry:5000/v2/"),
}


@pytest.mark.parametrize("text, reason", REFUSED.values(), ids=REFUSED)
def test_a_url_parsers_read_differently_is_refused_with_its_rule(text: str, reason: str) -> None:
    with pytest.raises(Failure) as caught:
        weburl.parse(text, who=WHO)
    assert caught.value.rule == "url-ambiguous" and reason in caught.value.message, caught.value.message
    assert text not in caught.value.render() and "\n" not in caught.value.message


@pytest.mark.parametrize("text, origin, canonical", ACCEPTED.values(), ids=ACCEPTED)
def test_a_url_parsers_agree_on_is_read_one_way(text: str, origin: weburl.Origin, canonical: str) -> None:
    url = weburl.parse(text, who=WHO)
    assert url.origin == origin and url.text == canonical
    assert weburl.parse(url.text, who=WHO) == url  # the canonical text reads back as the same object
    assert weburl.connects_to(url.text) == (url.host, url.port)


def test_a_location_is_joined_after_its_own_text_is_checked() -> None:
    base = weburl.parse("http://127.0.0.1:5000/v2/repo/blobs/uploads/", who=WHO)
    assert base.join("u1?state=a", who=WHO).text == "http://127.0.0.1:5000/v2/repo/blobs/uploads/u1?state=a"
    assert base.join("//127.0.0.2:9/x", who=WHO).origin == ("http", "127.0.0.2", 9)
    for reference in ("\\\\127.0.0.2/x", "/\\127.0.0.2/x", "http://127.0.0.2:9\\@127.0.0.1:5000/x", "http://[::1",
                      "https://[zz]/x"):
        with pytest.raises(Failure) as caught:
            base.join(reference, who=WHO)
        assert caught.value.rule == "url-ambiguous"


def test_the_configured_index_url_gives_its_credentials_apart() -> None:
    url, credentials = weburl.parse_with_userinfo("https://user:s%40cret@index.example/simple/", who=WHO)
    assert credentials == ("user", "s@cret") and url.text == "https://index.example/simple/"


def test_send_refuses_a_url_requests_would_read_as_another_host() -> None:
    """The object is built by parse; one made by hand that requests reads otherwise is never sent."""
    forged = weburl.WebUrl("http", "evil\\", 1, "@127.0.0.1:5000/v2/x")  # what a second reading could make

    class Nothing(requests.Session):
        def request(self, *args: object, **kwargs: object) -> requests.Response:
            raise AssertionError("sent")

    with pytest.raises(Failure) as caught:
        weburl.send(Nothing(), "GET", forged, who=WHO)
    assert caught.value.rule == "url-ambiguous"


_PIECES = st.sampled_from(["h.example", "127.0.0.1", "127.0.0.2", "[::1]", ":", ":5000", "@", "\\", "%5C", "/",
                           "?", "#", ".", "0x7f", "2130706433", "[", "]", " ", "\t", "\u00e9", "user", "%40", "-"])


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["http://", "https://", "HTTP://"]), st.lists(_PIECES, max_size=8))
def test_whatever_is_accepted_both_parsers_read_as_the_same_host(scheme: str, pieces: list[str]) -> None:
    text = scheme + "".join(pieces)
    try:
        url = weburl.parse(text, who=WHO)
    except Failure as refused:
        assert refused.rule == "url-ambiguous"
        return
    split = urlsplit(url.text)
    parsed = parse_url(url.text)
    host = url.host.strip("[]")
    assert (split.hostname, split.port or weburl.DEFAULT_PORTS[url.scheme]) == (host, url.port)
    assert ((parsed.host or "").strip("[]"), parsed.port or weburl.DEFAULT_PORTS[url.scheme]) == (host, url.port)
    # And the text given was read as that host by both, too (nothing parsers disagree on got through).
    assert urlsplit(text).hostname == host and (parse_url(text).host or "").lower().strip("[]") == host
