"""run.registry's client against a small stdlib HTTP(S) server on 127.0.0.1 that answers what a test scripts:
answers checked before use (digests, JSON shapes, sizes), the 401 challenge answered with basic auth or a
bearer token (scopes, expiry), TLS trust from certs.d and its errors, daemon.json's insecure registries."""
from __future__ import annotations

import json
import os
import ssl
import threading
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from support.host import Answer, Host, Seen, server_context
from support.registry import FakeRegistry

from xla_images.errors import ConfigError, Failure
from xla_images.model.registry import Registry
from xla_images.run.shipping import prune, resolve
from xla_images.run.registry import Credentials, RegistryClient, RetryPolicy, auth, client as client_module, tls
from xla_images.run.registry.errors import unreachable_hint

DIGEST = "sha256:" + "a" * 64
NO_WAIT = RetryPolicy(attempts=2, first_wait=0.0, max_wait=0.0)


@pytest.fixture
def serve() -> Iterator[Callable[..., Host]]:
    """Starts recording hosts on 127.0.0.1 that answer a route; closes them after the test."""
    started: list[Host] = []

    def start(route: Callable[[Seen], Answer], context: ssl.SSLContext | None = None) -> Host:
        started.append(Host(route=route, context=context).start())
        return started[-1]

    yield start
    for server in started:
        server.close()


def client_for(server: Host, credentials: Credentials | None = None, **kwargs: object) -> RegistryClient:
    return RegistryClient(Registry.parse(f"{server.host}/repo"), credentials, retry=NO_WAIT, **kwargs)  # type: ignore


# --- answers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("header", ["sha256:zzz", "sha256:" + "A" * 64, "md5:abc", DIGEST + "0"])
def test_a_digest_header_outside_the_grammar_is_refused_not_printed(serve, header: str) -> None:
    server = serve(lambda seen: (200, {"Docker-Content-Digest": header}, b""))
    flavour_client = client_for(server)
    with pytest.raises(Failure) as caught:
        flavour_client.manifest_digest("t")
    assert caught.value.rule == "registry-answer" and "not sha256:<64 hex>" in caught.value.message


@pytest.mark.parametrize("body, problem", [
    (b"<html>proxy error</html>", "not JSON"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'{"tags": [1, "a"]}', "not a list of strings"),
    (b'{"tags": "latest"}', "not a list of strings"),
])
def test_a_tag_list_that_is_not_one_is_refused(serve, body: bytes, problem: str) -> None:
    server = serve(lambda seen: (200, {"Content-Type": "application/json"}, body))
    with pytest.raises(Failure) as caught:
        client_for(server).tag_digests()  # what prune reads
    assert caught.value.rule == "registry-answer" and problem in caught.value.message


@pytest.mark.parametrize("body", [b"not json", b'["a", "b"]', b'{"tags": ["a", 7]}'])
def test_prune_refuses_a_garbled_tag_list_before_deciding_anything(serve, body: bytes) -> None:
    def route(seen: Seen) -> Answer:
        return (200, {}, body) if seen.path.endswith("/tags/list") else (200, {}, b"{}")

    server = serve(route)
    with pytest.raises(Failure) as caught:
        prune.prune(client_for(server), keep=0, older_than_days=0, protected={}, collect=False)
    assert caught.value.rule == "registry-answer"
    assert "DELETE" not in server.methods()


def test_an_oversized_answer_is_refused_before_it_is_all_read(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module.answers, "TAGS_LIMIT", 1000)
    server = serve(lambda seen: (200, {}, json.dumps({"tags": ["t"] * 1000}).encode()))
    with pytest.raises(Failure, match="at most 1000 bytes expected"):
        client_for(server).tags()


def test_tag_pages_are_followed(serve) -> None:
    def route(seen: Seen) -> Answer:
        if "last=" in seen.path:
            return 200, {}, b'{"tags": ["b"]}'
        return 200, {"Link": '</v2/repo/tags/list?last=a&n=1>; rel="next"'}, b'{"tags": ["a"]}'

    assert client_for(serve(route)).tags() == ["a", "b"]


# --- auth ------------------------------------------------------------------------------------------------

def test_bearer_tokens_are_fetched_with_the_scopes_then_reused() -> None:
    with FakeRegistry(auth="bearer", user="user", password="pw") as server:
        digest = server.put_manifest("repo", "a", b"{}")
        server.put_manifest("repo", "b", b"{}")
        client = client_for(server, Credentials("user", "pw"), actions="pull",
                            extra_scopes=("repository:other:pull",))
        assert client.manifest_digest("a") == digest and client.manifest_digest("b") == digest
    assert server.tokens == ["tok-0"]  # one token for both calls
    token_request = next(seen.path for seen in server.seen if seen.path.startswith("/token"))
    query = parse_qs(urlsplit(token_request).query)
    assert query["scope"] == ["repository:repo:pull", "repository:other:pull"] and query["service"] == ["reg"]


def test_an_expired_token_is_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeRegistry(auth="bearer", user="user", password="pw", lifetime=600) as server:
        digest = [server.put_manifest("repo", tag, b"{}") for tag in "abc"][0]
        client = client_for(server, Credentials("user", "pw"))
        now = [1000.0]
        monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
        client.manifest_digest("a")
        now[0] += 100
        client.manifest_digest("b")
        assert server.tokens == ["tok-0"]
        now[0] += 600  # past expires_in: the stale token is not sent; the challenge earns a new one
        assert client.manifest_digest("c") == digest
    assert server.tokens == ["tok-0", "tok-1"]


def test_refused_credentials_name_their_source_never_the_secret() -> None:
    credentials = Credentials("user", "wrong-secret", "credential helper docker-credential-pass (credsStore in x)")
    with FakeRegistry(auth="bearer", user="user", password="pw") as server, pytest.raises(Failure) as caught:
        server.put_manifest("repo", "a", b"{}")
        client_for(server, credentials).manifest_digest("a")
    text = caught.value.render()
    assert caught.value.rule == "registry-auth" and "docker-credential-pass" in text and "wrong-secret" not in text


def test_basic_challenge_is_answered_then_sent_up_front() -> None:
    with FakeRegistry(auth="basic", user="user", password="pw") as server:
        for tag in "ab":
            server.put_manifest("repo", tag, b"{}")
        client = client_for(server, Credentials("user", "pw"))
        client.manifest_digest("a")
        client.manifest_digest("b")
    assert len(server.seen) == 3  # one challenge, then credentials sent with every request


@pytest.mark.parametrize("header, scheme, params", [
    ('Bearer realm="https://a/token",service="r",scope="repository:x:pull,push"', "bearer",
     {"realm": "https://a/token", "service": "r", "scope": "repository:x:pull,push"}),
    ('Basic realm="x \\"y\\""', "basic", {"realm": 'x "y"'}),
    ("Bearer realm=https://a/t", "bearer", {"realm": "https://a/t"}),
])
def test_challenges_parse(header: str, scheme: str, params: dict[str, str]) -> None:
    challenge = auth.parse_challenge(header)
    assert challenge is not None and challenge.scheme == scheme and challenge.params == params


# --- TLS -------------------------------------------------------------------------------------------------

def test_tls_trust_comes_from_certs_d_and_its_absence_names_the_file(serve, certificate: Path,
                                                                     tmp_path: Path) -> None:
    context = server_context(certificate)
    server = serve(lambda seen: (200, {}, b"{}"), context)
    certs_d = tmp_path / "certs.d"
    untrusted = tls.Trust(server.host, "https", certs_d)
    with pytest.raises(Failure) as caught:
        client_for(server, trust=untrusted).check_reachable()
    assert caught.value.rule == "registry-tls" and f"{certs_d}/{server.host}/ca.crt" in caught.value.render()
    (certs_d / server.host).mkdir(parents=True)
    (certs_d / server.host / "ca.crt").write_bytes((certificate / "cert.pem").read_bytes())
    trusted = tls.load_trust(server.host, {tls.CERTS_D_ENV: str(certs_d), tls.DAEMON_JSON_ENV: str(tmp_path / "no"),
                                           "SSL_CERT_FILE": ""})
    assert trusted.scheme == "http"  # loopback: the engine speaks plain http to it, and so do we
    client_for(server, trust=tls.Trust(server.host, "https", certs_d, trusted_cas(certs_d, server.host))
               ).check_reachable()


def trusted_cas(certs_d: Path, host: str) -> tuple[Path, ...]:
    return tuple(sorted((certs_d / host).glob("*.crt")))


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    (tmp_path / "reg.example.com").mkdir()
    (tmp_path / "reg.example.com" / "client.cert").write_text("x")
    with pytest.raises(ConfigError, match="has no client.key beside it"):
        tls.load_trust("reg.example.com", {tls.CERTS_D_ENV: str(tmp_path), tls.DAEMON_JSON_ENV: str(tmp_path / "no")})


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_ssl_cert_file_that_is_no_file_is_refused_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     kind: str) -> None:
    store = tmp_path / "store"
    if kind == "fifo":
        os.mkfifo(store)
    else:
        store.mkdir()
    monkeypatch.setenv("SSL_CERT_FILE", str(store))
    outcome: list[BaseException | None] = []

    def make() -> None:
        try:
            tls.Trust("reg.example.com", "https", tmp_path).ssl_context()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 -- handed to the test's thread
            outcome.append(error)

    worker = threading.Thread(target=make, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive() and kind == "fifo":  # blocked opening the fifo: release it, then fail
        os.close(os.open(store, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
    assert outcome and isinstance(outcome[0], ConfigError) and outcome[0].rule == "registry-tls"
    assert "SSL_CERT_FILE" in outcome[0].message and kind in outcome[0].message


def test_insecure_registries_of_daemon_json_speak_http(tmp_path: Path) -> None:
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"insecure-registries": ["reg.lan:5000", "10.0.0.0/8"]}))
    env = {tls.DAEMON_JSON_ENV: str(daemon), tls.CERTS_D_ENV: str(tmp_path)}
    assert tls.load_trust("reg.lan:5000", env).base_url == "http://reg.lan:5000"
    assert tls.load_trust("10.1.2.3:80", env).scheme == "http"
    assert tls.load_trust("reg.example.com", env).base_url == "https://reg.example.com"
    daemon.write_text('{"insecure-registries": "reg.lan"}')
    with pytest.raises(ConfigError) as caught:
        tls.load_trust("reg.lan:5000", env)
    assert caught.value.rule == "daemon-json"


def test_unreachable_hints_name_the_suite_registry_only_on_loopback() -> None:
    assert "ci/registry.sh" in unreachable_hint("127.0.0.1:5000")
    assert "ci/registry.sh" not in unreachable_hint("registry.example.com:5000")


def test_a_name_that_does_not_resolve_is_a_dns_failure() -> None:
    client = RegistryClient(Registry.parse("no-such-host.invalid/x"), retry=NO_WAIT)
    with pytest.raises(Failure) as caught:
        client.check_reachable()
    assert caught.value.rule == "registry-dns" and "ci/registry.sh" not in caught.value.render()


def test_resolve_warns_when_the_registry_is_away_but_fails_on_a_setup_to_fix(serve, certificate: Path,
                                                                             tmp_path: Path) -> None:
    candidate = resolve.Candidate("t", f"no-such-host.invalid/x@{DIGEST}", {})
    warned: list[str] = []
    away = RegistryClient(Registry.parse("no-such-host.invalid/x"), retry=NO_WAIT)
    assert resolve.verify(candidate, away, warned.append).verified is False and "could not re-verify" in warned[0]
    context = server_context(certificate)
    server = serve(lambda seen: (200, {}, b"{}"), context)
    untrusted = client_for(server, trust=tls.Trust(server.host, "https", tmp_path))
    with pytest.raises(Failure) as caught:
        resolve.verify(candidate, untrusted, warned.append)
    assert caught.value.rule == "registry-tls" and len(warned) == 1
