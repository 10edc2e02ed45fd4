"""What the registry client reads, verified (run/registry/answers.py through RegistryClient's public reads), each
against a real misbehaving registry on 127.0.0.1 (rude_server): digests equal to the ones asked for, manifests of
a known media type before their digest is used, an overall deadline on every exchange (1 s here, by parameter,
against a server dribbling a byte every 0.3 s), bodies bounded and cut or broken bodies refused, tag lists
streamed page by page and capped."""
from __future__ import annotations

import hashlib
import json
import time
from typing import Callable, Iterator

import pytest

from rude_server import Exchange, RudeServer, answer
from xla_images.errors import Failure
from xla_images.model.registry import Registry
from xla_images.run.shipping import resolve
from xla_images.run.registry import RegistryClient, RetryPolicy, answers, client as client_module

NO_WAIT = RetryPolicy(attempts=2, first_wait=0.0, max_wait=0.0)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
Route = Callable[[Exchange], bytes]


def manifest(layer: int = 1) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": "sha256:" + "c" * 64, "size": 2},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                   "digest": "sha256:" + f"{layer:064x}", "size": 10}]}).encode()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


A, B = manifest(1), manifest(2)


@pytest.fixture
def registry() -> Iterator[Callable[[Route], RudeServer]]:
    """A registry whose every answer is `route(exchange)`'s bytes (or what the route sends itself: b"")."""
    started: list[RudeServer] = []

    def start(route: Route) -> RudeServer:
        def script(exchange: Exchange) -> None:
            data = route(exchange)
            if data:
                exchange.send(data)

        started.append(RudeServer(script))
        return started[-1]

    yield start
    for server in started:
        server.close()


def client_for(server: RudeServer, deadline: float = 30.0) -> RegistryClient:
    return RegistryClient(Registry.parse(f"{server.host}/repo"), None, retry=NO_WAIT, deadline=deadline)


def head_answers(digest: str) -> Route:
    return lambda exchange: answer(200, {"Docker-Content-Digest": digest})


# --- digests ---------------------------------------------------------------------------------------------

def test_a_manifest_fetched_by_digest_must_hash_to_it(registry) -> None:
    server = registry(lambda exchange: answer(200, {"Content-Type": OCI_MANIFEST}, B))
    with pytest.raises(Failure) as caught:
        client_for(server).manifest_bytes(sha(A))
    assert caught.value.rule == "registry-digest" and sha(A) in caught.value.message and sha(B) in caught.value.message


def test_a_head_by_digest_must_answer_that_digest(registry) -> None:
    server = registry(head_answers(sha(B)))
    with pytest.raises(Failure) as caught:
        client_for(server).manifest_digest(sha(A))
    assert caught.value.rule == "registry-digest"


def test_resolve_does_not_re_verify_a_digest_the_registry_answers_with_another(registry) -> None:
    server = registry(head_answers(sha(B)))
    candidate = resolve.Candidate("t", f"{server.host}/repo@{sha(A)}", {})
    with pytest.raises(Failure) as caught:
        resolve.verify(candidate, client_for(server), lambda line: None)
    assert caught.value.rule == "registry-digest"


@pytest.mark.parametrize("content_type, body, problem", [
    ("text/html", b"<html>login</html>", "not JSON"),
    ("application/json", b'["a", "b"]', "a JSON list"),
    ("application/json", b'{"tags": ["a"]}', "Content-Type 'application/json'"),
    (OCI_MANIFEST, b'{"schemaVersion": 1, "fsLayers": []}', "schemaVersion 1"),
    ("text/plain", json.dumps({"schemaVersion": 2, "mediaType": "text/plain"}).encode(), "media type 'text/plain'"),
])
def test_a_manifest_fetched_by_tag_must_be_one_before_its_digest_is_used(registry, content_type: str, body: bytes,
                                                                         problem: str) -> None:
    def route(exchange: Exchange) -> bytes:  # a HEAD without Docker-Content-Digest: the client fetches and hashes
        return answer(200, {"Content-Type": content_type}, b"" if exchange.method == "HEAD" else body,
                      length=len(body))

    server = registry(route)
    with pytest.raises(Failure) as caught:  # what `resolve --registry` asks of each flavour's tag
        client_for(server).manifest_digest("r2.9.0_3.11_cpu")
    assert caught.value.rule == "registry-answer" and problem in caught.value.message


def test_a_manifest_whose_bytes_are_not_its_docker_content_digest_is_refused(registry) -> None:
    server = registry(lambda exchange: answer(200, {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": sha(B)}, A))
    with pytest.raises(Failure) as caught:
        client_for(server).manifest_bytes("tag")
    assert caught.value.rule == "registry-digest"


def test_a_verified_manifest_is_read(registry) -> None:
    server = registry(lambda exchange: answer(200, {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": sha(A)}, A))
    assert client_for(server).manifest_bytes(sha(A)) == (A, OCI_MANIFEST, sha(A))


def test_a_config_blob_of_another_digest_is_refused(registry) -> None:
    server = registry(lambda exchange: answer(200, {}, b"{}"))
    with pytest.raises(Failure) as caught:
        client_for(server).blob_json(sha(b"{ }"))
    assert caught.value.rule == "registry-digest"


# --- deadlines -------------------------------------------------------------------------------------------

def dribbling(exchange: Exchange) -> bytes:
    exchange.dribble(answer(200, {"Docker-Content-Digest": sha(A), "Content-Type": OCI_MANIFEST}, A), every=0.3)
    return b""


@pytest.mark.parametrize("read", [
    lambda client: client.manifest_digest("tag"),
    lambda client: client.manifest_bytes("tag"),
    lambda client: client.check_reachable(),
    lambda client: client.tags(),
])
def test_a_registry_dribbling_its_answer_is_cut_at_the_deadline(registry, read) -> None:
    with pytest.raises(Failure) as caught:
        read(client_for(registry(dribbling), deadline=1.0))
    assert caught.value.rule == "registry-slow" and "1 s" in caught.value.message


def test_a_registry_dribbling_a_manifest_body_is_cut_at_the_deadline(registry) -> None:
    def route(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {"Content-Type": OCI_MANIFEST}, length=len(A)))
        exchange.dribble(A, every=0.3)
        return b""

    with pytest.raises(Failure) as caught:
        client_for(registry(route), deadline=1.0).manifest_bytes(sha(A))
    assert caught.value.rule == "registry-slow"


def test_resolve_warns_about_a_slow_registry_and_keeps_the_recorded_digest(registry) -> None:
    server = registry(dribbling)
    warned: list[str] = []
    candidate = resolve.Candidate("t", f"{server.host}/repo@{sha(A)}", {})
    resolved = resolve.verify(candidate, client_for(server, deadline=1.0), warned.append)
    assert not resolved.verified and "within 1 s" in warned[0]


# --- bodies ----------------------------------------------------------------------------------------------

def test_a_manifest_shorter_than_its_content_length_is_a_failure(registry) -> None:
    def route(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {"Content-Type": OCI_MANIFEST}, A[:50], length=len(A)))
        exchange.conn.close()
        return b""

    with pytest.raises(Failure) as caught:
        client_for(registry(route)).manifest_bytes(sha(A))
    assert caught.value.rule == "registry-answer" and "broke off" in caught.value.message


def test_a_manifest_in_broken_gzip_is_a_failure(registry) -> None:
    broken = b"\x1f\x8b\x08\x00" + b"\xff" * 100
    server = registry(lambda exchange: answer(200, {"Content-Type": OCI_MANIFEST, "Content-Encoding": "gzip"}, broken))
    with pytest.raises(Failure) as caught:
        client_for(server).manifest_bytes("tag")
    assert caught.value.rule == "registry-answer"


# --- tag lists -------------------------------------------------------------------------------------------

def endless_pages(exchange: Exchange) -> bytes:
    """Every page names one new tag and links to the next, forever."""
    number = int(exchange.path.rpartition("last=t")[2] or 0) if "last=" in exchange.path else 0
    link = f'</v2/repo/tags/list?n=1&last=t{number + 1}>; rel="next"'
    return answer(200, {"Link": link}, json.dumps({"tags": [f"t{number + 1}"]}).encode())


def test_a_tag_list_that_never_ends_is_refused_not_cut_silently(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_TAG_PAGES", 5)
    server = registry(endless_pages)
    with pytest.raises(Failure) as caught:
        client_for(server).tags()
    assert caught.value.rule == "registry-too-many-tags" and "5 pages" in caught.value.message
    assert len(server.requests) == 5


def test_tags_are_capped_as_the_pages_arrive(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module.answers, "MAX_TAGS", 3)
    server = registry(endless_pages)
    with pytest.raises(Failure) as caught:
        client_for(server).tags()
    assert caught.value.rule == "registry-too-many-tags" and len(server.requests) == 4


def test_a_tag_page_is_bounded(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(answers, "TAGS_LIMIT", 1000)
    def route(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {"Transfer-Encoding": "chunked"}))
        exchange.endless(b"10000\r\n" + b" " * 0x10000 + b"\r\n")
        return b""

    server = registry(route)
    with pytest.raises(Failure) as caught:
        client_for(server).tags()
    assert caught.value.rule == "registry-answer" and "at most 1000 bytes" in caught.value.message


def test_tag_digests_asks_no_head_beyond_its_cap(registry) -> None:
    tags = [f"t{number}" for number in range(50)]
    server = registry(lambda exchange: answer(200, {}, json.dumps({"tags": tags}).encode()))
    with pytest.raises(Failure) as caught:
        client_for(server).tag_digests(limit=10)
    assert caught.value.rule == "registry-too-many-tags"
    assert [method for method, _ in server.requests] == ["GET"]


def test_tag_digests_end_together_not_only_each_head(registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each HEAD answers well within its own deadline, but all of them together pass the whole one."""
    tags = [f"t{number}" for number in range(20)]

    def route(exchange: Exchange) -> bytes:
        if exchange.method == "GET":
            return answer(200, {}, json.dumps({"tags": tags}).encode())
        time.sleep(0.2)
        return answer(200, {"Docker-Content-Digest": sha(A)})

    monkeypatch.setattr(client_module, "TAG_DIGESTS_DEADLINE", 1.0)
    server = registry(route)
    with pytest.raises(Failure) as caught:
        client_for(server, deadline=30.0).tag_digests()
    assert caught.value.rule == "registry-slow" and "HEAD of 20 tags" in caught.value.message
    assert len(server.requests) < 12


@pytest.mark.parametrize("tag", ["x" * 129, "-leading-dash", "a/b", ""])
def test_a_tag_outside_the_grammar_is_refused(registry, tag: str) -> None:
    server = registry(lambda exchange: answer(200, {}, json.dumps({"tags": [tag]}).encode()))
    with pytest.raises(Failure) as caught:
        client_for(server).tags()
    assert caught.value.rule == "registry-answer"


# --- Locations -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("location", ["http://[::1", "https://[zz]/x"])
def test_a_redirect_to_a_location_that_is_no_url_is_a_failure(registry, location: str) -> None:
    server = registry(lambda exchange: answer(307, {"Location": location}))
    with pytest.raises(Failure) as caught:
        client_for(server).manifest_bytes(sha(A))
    # Refused by the one strict reading of a URL (run.weburl), never shown: it may hold a user:password part.
    assert caught.value.rule == "url-ambiguous" and location not in caught.value.message


def test_an_upload_location_that_is_no_url_is_a_failure(registry) -> None:
    server = registry(lambda exchange: answer(202, {"Location": "http://[::1/upload"}))
    with pytest.raises(Failure) as caught:
        client_for(server).request("PATCH", "http://[::1/upload", data=b"x")
    assert caught.value.rule == "url-ambiguous"


# --- answers nobody streams ------------------------------------------------------------------------------

def test_an_unstreamed_answer_is_bounded_before_it_is_all_in_memory(registry) -> None:
    endless = b"x" * (answers.SMALL_ANSWER_LIMIT + 1)  # chunked: no Content-Length to refuse up front
    server = registry(lambda exchange: answer(200, {"Transfer-Encoding": "chunked"},
                                              f"{len(endless):x}\r\n".encode() + endless + b"\r\n0\r\n\r\n"))
    with pytest.raises(Failure) as caught:
        client_for(server).check_reachable()
    assert caught.value.rule == "registry-answer" and "GET /v2/" in caught.value.message


def test_an_unstreamed_answer_within_its_bound_is_served_as_content(registry) -> None:
    server = registry(lambda exchange: answer(202, {"Location": "/v2/repo/blobs/uploads/1"}, b'{"ok": true}'))
    response = client_for(server).request("POST", "/v2/repo/blobs/uploads/")
    assert response.status_code == 202 and response.json() == {"ok": True}


def test_a_head_answer_declaring_a_large_blob_is_no_body_to_bound(registry) -> None:
    """HEAD of a 2.6 MB blob answers Content-Length: 2622446 and no body: not an answer over the 1 MiB bound."""
    server = registry(lambda exchange: answer(200, {"Content-Length": "2622446",
                                                    "Transfer-Encoding": "identity"}))
    response = client_for(server).request("HEAD", "/v2/repo/blobs/sha256:" + "a" * 64)
    assert response.status_code == 200 and response.content == b""
