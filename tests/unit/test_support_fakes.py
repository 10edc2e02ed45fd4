"""The kit of HTTP fakes (tests/support) does what the tests that use it take for granted: a host records every
request and its Authorization, faults are what they say, the registry keeps what it is given and wants a token
after its 401 challenge, the index answers range reads with the right bytes. Asked with http.client, not with
the product's clients, so a product bug cannot hide a fake's."""
from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import ssl
import tarfile
import time
from pathlib import Path

import pytest

import requests

from support.host import Host, Stalled, Truncated, fixed, forward, server_context
from support.index import FakeIndex, html_page, json_page, wheel
from support.registry import FakeRegistry, digest_of, gzipped, tar_of, zstd_compressed

TIMEOUT = 10.0
Reply = tuple[int, dict[str, str], bytes]


def ask(host: Host | str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None,
        timeout: float = TIMEOUT) -> Reply:
    where = host.host if isinstance(host, Host) else host
    connection = http.client.HTTPConnection(where, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, {key.lower(): value for key, value in response.getheaders()}, data
    finally:
        connection.close()


# --- the recording host ----------------------------------------------------------------------------------------

def test_a_host_records_every_request_with_its_authorization_and_body() -> None:
    with Host("127.0.0.2", status=204) as host:
        assert ask(host, "GET", "/a?x=1", {"Authorization": "Bearer t"})[0] == 204
        assert ask(host, "PUT", "/b", body=b"payload")[0] == 204
    assert [(seen.method, seen.path, seen.body) for seen in host.seen] == [("GET", "/a?x=1", b""),
                                                                           ("PUT", "/b", b"payload")]
    assert host.authorizations() == ["Bearer t"] and host.leaks(("payload", "absent")) == ["payload"]
    assert host.url.startswith("http://127.0.0.2:")


def test_a_host_answers_its_route_and_listens_on_loopback_only() -> None:
    with Host(route=lambda seen: (200, {"X-Path": seen.path}, b"body")) as host:
        status, headers, body = ask(host, "GET", "/where")
    assert (status, headers["x-path"], body) == (200, "/where", b"body")
    with pytest.raises(ValueError, match="loopback only"):
        Host("0.0.0.0")


def test_an_ipv6_loopback_host_is_named_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with Host("::1", route=fixed(200)) as host:
        assert host.host.startswith("[::1]:") and ask(host, "GET", "/")[0] == 200


def test_a_tls_host_is_trusted_with_its_certificate_only(certificate: Path) -> None:
    with Host(route=fixed(200, body=b"secure"), context=server_context(certificate)) as host:
        trusting = ssl.create_default_context(cafile=str(certificate / "cert.pem"))
        connection = http.client.HTTPSConnection(host.host, timeout=TIMEOUT, context=trusting)
        connection.request("GET", "/")
        assert connection.getresponse().read() == b"secure" and host.url.startswith("https://")
        connection.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting = http.client.HTTPSConnection(host.host, timeout=TIMEOUT, context=ssl.create_default_context())
            untrusting.request("GET", "/")


def test_a_truncated_answer_promises_more_than_it_sends() -> None:
    with Host(route=lambda seen: Truncated((200, {}, b"0123456789"), keep=4)) as host:
        connection = http.client.HTTPConnection(host.host, timeout=TIMEOUT)
        connection.request("GET", "/")
        response = connection.getresponse()
        assert response.getheader("Content-Length") == "10"
        with pytest.raises(http.client.IncompleteRead) as caught:
            response.read()
        connection.close()
    assert caught.value.partial == b"0123"


def test_a_stall_outlasts_a_client_timeout_and_ends_when_the_host_closes() -> None:
    host = Host(route=lambda seen: Stalled(60.0)).start()
    started = time.monotonic()
    with pytest.raises((TimeoutError, socket.timeout)):
        ask(host, "GET", "/", timeout=0.5)
    host.close()  # releases the stalled handler at once, not after 60 seconds
    assert time.monotonic() - started < 5


def test_a_front_forwards_a_request_as_it_came_and_passes_back_what_clients_read() -> None:
    """forward: method, path, body and Authorization reach the upstream; its redirect is passed back, not
    followed; only the headers registry clients read come back."""
    answer = (307, {"Location": "http://127.0.0.3:1/elsewhere", "Docker-Content-Digest": "sha256:ab",
                    "X-Upstream-Only": "private"}, b"moved")
    session = requests.Session()
    session.trust_env = False
    with Host("127.0.0.2", route=lambda seen: answer) as upstream, \
            Host(route=lambda seen: forward(seen, upstream.url, session)) as front:
        status, headers, body = ask(front, "PUT", "/v2/r/blobs/uploads/1?digest=sha256:ab",
                                    {"Authorization": "Basic c2VjcmV0", "Content-Type": "x/y"}, b"layer")
    assert (status, body, headers["location"], headers["docker-content-digest"]) == \
        (307, b"moved", "http://127.0.0.3:1/elsewhere", "sha256:ab")
    assert "x-upstream-only" not in headers
    assert [(seen.method, seen.path, seen.body, seen.authorization, seen.headers["content-type"])
            for seen in upstream.seen] == [("PUT", "/v2/r/blobs/uploads/1?digest=sha256:ab", b"layer",
                                            "Basic c2VjcmV0", "x/y")]
    assert front.authorizations() == upstream.authorizations()


# --- the registry ----------------------------------------------------------------------------------------------

def test_a_pushed_blob_and_manifest_are_served_by_tag_and_digest_then_deleted() -> None:
    layer = gzipped(b"layer")
    with FakeRegistry() as registry:
        assert ask(registry, "GET", "/v2/")[0] == 200
        status, headers, _ = ask(registry, "POST", "/v2/team/app/blobs/uploads/")
        assert status == 202
        status, headers, _ = ask(registry, "PATCH", headers["location"], body=layer[:5])
        status, _, _ = ask(registry, "PUT", f"{headers['location']}?digest={digest_of(layer)}", body=layer[5:])
        assert status == 201 and ask(registry, "GET", f"/v2/team/app/blobs/{digest_of(layer)}")[2] == layer
        manifest = json.dumps({"layers": [{"digest": digest_of(layer)}]}).encode()
        assert ask(registry, "PUT", "/v2/team/app/manifests/v1", body=manifest)[0] == 201
        status, headers, _ = ask(registry, "HEAD", "/v2/team/app/manifests/v1")
        assert status == 200 and headers["docker-content-digest"] == digest_of(manifest)
        assert ask(registry, "GET", f"/v2/team/app/manifests/{digest_of(manifest)}")[2] == manifest
        assert json.loads(ask(registry, "GET", "/v2/team/app/tags/list")[2])["tags"] == ["v1"]
        assert json.loads(ask(registry, "GET", "/v2/_catalog")[2]) == {"repositories": ["team/app"]}
        assert ask(registry, "DELETE", f"/v2/team/app/manifests/{digest_of(manifest)}")[0] == 202
        assert ask(registry, "HEAD", "/v2/team/app/manifests/v1")[0] == 404


def test_a_tar_holds_its_members_in_order_and_is_the_same_every_time() -> None:
    members = {"b/file": b"second", "a": b"", "blobs/sha256/x": b"\x00" * 600}
    data = tar_of(members)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        read = {info.name: archive.extractfile(info).read() for info in archive.getmembers()}
    assert list(read) == list(members) and read == members and tar_of(members) == data


def test_an_upload_whose_bytes_do_not_match_its_digest_is_refused() -> None:
    with FakeRegistry() as registry:
        location = ask(registry, "POST", "/v2/app/blobs/uploads/")[1]["location"]
        assert ask(registry, "PUT", f"{location}?digest={digest_of(b'other')}", body=b"bytes")[0] == 400
        assert registry.blobs == {}


def test_a_zstd_blob_is_served_as_stored() -> None:
    import zstandard

    with FakeRegistry() as registry:
        digest = registry.put_blob(zstd_compressed(b"layer"))
        data = ask(registry, "GET", f"/v2/app/blobs/{digest}")[2]
    assert zstandard.ZstdDecompressor().decompress(data) == b"layer"


def test_a_bearer_registry_wants_a_token_after_its_challenge() -> None:
    with FakeRegistry(auth="bearer") as registry:
        registry.put_manifest("app", "v1", b"{}")
        status, headers, _ = ask(registry, "HEAD", "/v2/app/manifests/v1")
        assert status == 401 and f'realm="{registry.url}/token"' in headers["www-authenticate"]
        assert ask(registry, "GET", "/token?service=reg&scope=x")[0] == 401  # no credentials, no token
        assert ask(registry, "HEAD", "/v2/app/manifests/v1", {"Authorization": registry.basic})[0] == 401
        token = json.loads(ask(registry, "GET", "/token", {"Authorization": registry.basic})[2])["token"]
        assert ask(registry, "HEAD", "/v2/app/manifests/v1", {"Authorization": f"Bearer {token}"})[0] == 200
        assert ask(registry, "GET", "/token", {"Authorization": registry.basic})[0] == 200  # a newer token ...
        assert ask(registry, "HEAD", "/v2/app/manifests/v1", {"Authorization": f"Bearer {token}"})[0] == 401
    assert registry.tokens == ["tok-0", "tok-1"]  # ... and the older one is stale


def test_a_basic_registry_challenges_and_takes_its_credentials() -> None:
    with FakeRegistry(auth="basic", user="bot", password="s3cret") as registry:
        status, headers, _ = ask(registry, "GET", "/v2/")
        assert status == 401 and headers["www-authenticate"].startswith("Basic ")
        basic = "Basic " + base64.b64encode(b"bot:s3cret").decode()
        assert ask(registry, "GET", "/v2/", {"Authorization": basic})[0] == 200
    assert registry.authorizations() == [basic]


def test_reads_redirect_and_faults_win_for_as_long_as_scripted() -> None:
    with FakeRegistry() as registry:
        digest = registry.put_blob(b"blob")
        registry.redirect_reads_to = "http://127.0.0.2:1"
        status, headers, _ = ask(registry, "GET", f"/v2/app/blobs/{digest}")
        assert status == 307 and headers["location"] == f"http://127.0.0.2:1/v2/app/blobs/{digest}"
        assert ask(registry, "HEAD", f"/v2/app/blobs/{digest}")[0] == 200  # a HEAD is answered here
        registry.fault("GET", r"^/v2/$", (503, {}, b""), times=1)
        assert [ask(registry, "GET", "/v2/")[0] for _ in range(2)] == [503, 200]


# --- the package index -----------------------------------------------------------------------------------------

@pytest.fixture
def index() -> str:
    FakeIndex.reset()
    with FakeIndex.host() as host:
        yield host.host


def test_a_range_read_returns_the_right_bytes(index: str) -> None:
    data = wheel({"pkg-1.0.dist-info/METADATA": "Name: pkg\n"})
    FakeIndex.routes["/files/pkg.whl"] = (200, "application/octet-stream", data)
    status, headers, body = ask(index, "GET", "/files/pkg.whl", {"Range": "bytes=10-19"})
    assert (status, body, headers["content-range"]) == (206, data[10:20], f"bytes 10-19/{len(data)}")
    status, _, body = ask(index, "GET", "/files/pkg.whl", {"Range": "bytes=-22"})  # the zip's end record
    assert (status, body) == (206, data[-22:])
    FakeIndex.no_ranges = True
    assert ask(index, "GET", "/files/pkg.whl", {"Range": "bytes=10-19"})[:3:2] == (200, data)
    assert FakeIndex.requests == ["/files/pkg.whl"] * 3


def test_project_pages_in_both_forms(index: str) -> None:
    files = [{"filename": "pkg-1.0-py3-none-any.whl", "url": "../../files/pkg.whl"}]
    FakeIndex.routes["/simple/pkg/"] = json_page(files)
    FakeIndex.routes["/html/pkg/"] = html_page(files)
    assert json.loads(ask(index, "GET", "/simple/pkg/")[2])["files"] == files
    status, headers, body = ask(index, "GET", "/html/pkg/", {"Authorization": "Basic x"})
    assert headers["content-type"] == "text/html" and b'<a href="../../files/pkg.whl">pkg-1.0' in body
    assert ask(index, "GET", "/missing/")[0] == 404 and FakeIndex.authorizations == [None, "Basic x", None]
