"""Error paths of publishing with a fake registry and a fake engine: parsing, credentials and their redaction,
HTTP retries, digest verification, the push order, published.json merging."""
from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from targets import make_flavour
from xla_images import names
from xla_images.errors import ConfigError, Failure
from xla_images.model.compression import Compression
from xla_images.model.registry import Registry
from xla_images.model.target import Target
from xla_images.run import engine
from xla_images.model import published as model_published
from xla_images.run import registry as registries
from xla_images.run.shipping import publish
from xla_images.run.registry import Credentials, RegistryClient, RetryPolicy
from xla_images.run.registry import client as registry_client

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
SECRET = "s3cr3t-Pa55word!"
NO_WAIT = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0)


# --- registry names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, host, repository", [
    ("127.0.0.1:5000/xla-images", "127.0.0.1:5000", "xla-images"),
    ("registry.example.com/team/xla", "registry.example.com", "team/xla"),
    ("localhost/x", "localhost", "x"),
])
def test_registry_parse(text: str, host: str, repository: str) -> None:
    registry = Registry.parse(text)
    assert (registry.host, registry.repository) == (host, repository)
    assert registry.ref("t") == f"{host}/{repository}:t"


@pytest.mark.parametrize("text", ["xla-images", "docker.io", "myhub/xla", "127.0.0.1:5000/", "h.com/Upper"])
def test_registry_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Registry.parse(text)
    assert caught.value.rule == "registry-format"


def test_loopback_registries_speak_http_others_https() -> None:
    assert Registry.parse("127.0.0.1:5000/x").base_url == "http://127.0.0.1:5000"
    assert Registry.parse("localhost:5000/x").base_url == "http://localhost:5000"
    assert Registry.parse("reg.example.com/x").base_url == "https://reg.example.com"


# --- credentials ------------------------------------------------------------------------------------------

def test_credentials_from_environment_win() -> None:
    env = {registries.USER_ENV: "ci", registries.PASSWORD_ENV: SECRET}
    credentials = registries.load_credentials("h:1", env, docker_config=Path("/nonexistent"), named=("h:1",))
    assert credentials is not None and (credentials.username, credentials.password) == ("ci", SECRET)


def test_credentials_half_set_is_a_config_error_without_the_value() -> None:
    with pytest.raises(ConfigError) as caught:
        registries.load_credentials("h:1", {registries.PASSWORD_ENV: SECRET})
    assert SECRET not in caught.value.render()
    assert registries.USER_ENV in caught.value.render()


def test_credentials_from_docker_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    auth = base64.b64encode(f"bob:{SECRET}".encode()).decode()
    config.write_text(json.dumps({"auths": {"https://reg.example.com/v1/": {"auth": auth},
                                            "other:5000": {"auth": "eDp5"}}}))
    credentials = registries.load_credentials("reg.example.com", {}, docker_config=config)
    assert credentials is not None and (credentials.username, credentials.password) == ("bob", SECRET)
    assert credentials.source == f"`auths` in {config}"
    assert registries.load_credentials("unknown:1", {}, docker_config=config) is None


def test_docker_config_found_through_DOCKER_CONFIG(tmp_path: Path) -> None:
    auth = base64.b64encode(b"u:p").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"h:1": {"auth": auth}}}))
    credentials = registries.load_credentials("h:1", {"DOCKER_CONFIG": str(tmp_path)})
    assert credentials is not None and credentials.username == "u"


def test_malformed_docker_config_auth_is_not_echoed(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    bad = base64.b64encode(SECRET.encode()).decode()  # no colon: not USER:PASSWORD
    config.write_text(json.dumps({"auths": {"h:1": {"auth": bad}}}))
    with pytest.raises(ConfigError) as caught:
        registries.load_credentials("h:1", {}, docker_config=config)
    assert SECRET not in caught.value.render() and bad not in caught.value.render()


def test_credentials_repr_and_redaction_hide_the_password() -> None:
    credentials = Credentials("ci", SECRET)
    assert SECRET not in repr(credentials)
    encoded = base64.b64encode(f"ci:{SECRET}".encode()).decode()
    text = f"login ci:{SECRET} header Basic {encoded}"
    redacted = registries.redact(text, credentials)
    assert SECRET not in redacted and encoded not in redacted and "***" in redacted


def test_redacting_scrubs_failures_raised_inside() -> None:
    credentials = Credentials("ci", SECRET)
    with pytest.raises(Failure) as caught:
        with registries.redacting(credentials):
            raise Failure(f"push failed: auth ci:{SECRET} refused", hint=f"retry with {SECRET}")
    assert SECRET not in caught.value.render()
    assert SECRET not in str(caught.value)


# --- the HTTP API, with a fake session --------------------------------------------------------------------

class FakeResponse:
    def __init__(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.status_code = status
        self.headers = headers or {}
        self.content = body
        self.closed = False

    def json(self) -> Any:
        return json.loads(self.content)

    def iter_content(self, chunk_size: int) -> Any:
        return iter([self.content])

    def close(self) -> None:
        self.closed = True


class FakeSession:
    """Answers from a script: each entry is a response, or an exception to raise."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, str, dict[str, str], Any]] = []
        self.cookies = requests.cookies.RequestsCookieJar()  # what the client sets its no-cookie policy on

    def mount(self, prefix: str, adapter: Any) -> None:
        pass

    def request(self, method: str, url: str, headers: dict[str, str], auth: Any, timeout: float,
                allow_redirects: bool, **body: Any) -> FakeResponse:
        self.calls.append((method, url, dict(headers), auth))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def get(self, url: str, params: dict[str, str], auth: Any, timeout: float) -> FakeResponse:
        return self.request("GET", url, {}, auth, timeout, True)


def client(script: list[Any], credentials: Credentials | None = None) -> tuple[RegistryClient, FakeSession]:
    session = FakeSession(script)
    registry = Registry.parse("127.0.0.1:5999/xla-images")
    return RegistryClient(registry, credentials, retry=NO_WAIT, session=session), session  # type: ignore[arg-type]


def test_manifest_digest_reads_the_header_and_asks_for_every_manifest_type() -> None:
    registry, session = client([FakeResponse(200, {"Docker-Content-Digest": DIGEST_A})])
    assert registry.manifest_digest("r2.9.0_3.11_cpu") == DIGEST_A
    method, url, headers, _ = session.calls[0]
    assert method == "HEAD" and url == "http://127.0.0.1:5999/v2/xla-images/manifests/r2.9.0_3.11_cpu"
    for media_type in ("application/vnd.docker.distribution.manifest.v2+json",
                       "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"):
        assert media_type in headers["Accept"]


def test_manifest_digest_falls_back_to_hashing_the_body() -> None:
    body = manifest_of("application/vnd.oci.image.layer.v1.tar+gzip")
    registry, _ = client([FakeResponse(200), FakeResponse(200, body=body)])
    assert registry.manifest_digest("t") == "sha256:" + hashlib.sha256(body).hexdigest()


def test_missing_manifest_is_none() -> None:
    registry, _ = client([FakeResponse(404)])
    assert registry.manifest_digest("t") is None


def test_connection_errors_are_retried_then_succeed() -> None:
    registry, session = client([requests.ConnectionError("Connection refused"), FakeResponse(503),
                                FakeResponse(200, {"Docker-Content-Digest": DIGEST_A})])
    assert registry.manifest_digest("t") == DIGEST_A
    assert len(session.calls) == 3


def test_registry_down_after_retries_names_the_registry_and_the_start_script() -> None:
    registry, session = client([requests.ConnectionError("[Errno 111] Connection refused")] * 3)
    with pytest.raises(Failure) as caught:
        registry.check_reachable()
    text = caught.value.render()
    assert len(session.calls) == NO_WAIT.attempts
    assert "127.0.0.1:5999" in text and "ci/registry.sh start" in text and "connection refused" in text
    assert caught.value.rule == "registry-reachable"


def test_unauthorised_is_a_failure_with_a_login_hint() -> None:
    registry, _ = client([FakeResponse(401, {"WWW-Authenticate": 'Basic realm="r"'})])
    with pytest.raises(Failure) as caught:
        registry.manifest_digest("t")
    assert caught.value.rule == "registry-auth" and "docker login" in caught.value.render()


def test_bearer_challenge_fetches_a_token_with_basic_credentials() -> None:
    credentials = Credentials("ci", SECRET)
    challenge = 'Bearer realm="https://auth.example.com/token",service="reg"'
    registry, session = client([
        FakeResponse(401, {"WWW-Authenticate": challenge}),
        FakeResponse(200, body=json.dumps({"token": "tok-1"}).encode()),
        FakeResponse(200, {"Docker-Content-Digest": DIGEST_A}),
    ], credentials)
    assert registry.manifest_digest("t") == DIGEST_A
    assert session.calls[1][3] == ("ci", SECRET)  # the token request carries the login
    assert session.calls[2][2]["Authorization"] == "Bearer tok-1"


# --- push order and verification, with a fake engine ------------------------------------------------------

class FakeEngine:
    def __init__(self, digests: dict[str, str], labels: dict[str, str] | None, fail_on: str | None = None,
                 error_text: str = "boom", store: str = "classic") -> None:
        self.digests = digests
        self.store = store
        self.labels = labels
        self.fail_on = fail_on
        self.error_text = error_text
        self.events: list[tuple[str, str]] = []

    def image_labels(self, ref: str) -> dict[str, str] | None:
        return self.labels

    def image_store(self) -> str:
        return self.store

    def tag_image(self, image: str, repository: str, tag: str) -> None:
        self.events.append(("tag", f"{repository}:{tag}"))

    def remove_tag(self, ref: str) -> None:
        self.events.append(("untag", ref))

    def push_image(self, repository: str, tag: str, auth: Any, on_line: Any = None,
                   layer_status: Any = None) -> str:
        self.events.append(("push", tag))
        if tag == self.fail_on:
            raise Failure(f"push of {repository}:{tag} failed: {self.error_text}", rule="push")
        return self.digests[tag]


@pytest.fixture
def flavour() -> Target:
    return make_flavour()


def patch_engine(monkeypatch: pytest.MonkeyPatch, fake: FakeEngine) -> None:
    for module, name in ((engine.images, "image_labels"), (engine.images, "tag_image"),
                         (engine.images, "remove_tag"), (engine.transfer, "push_image"),
                         (engine.connection, "image_store")):
        monkeypatch.setattr(module, name, getattr(fake, name))


def good_labels(flavour: Target) -> dict[str, str]:
    return {names.FLAVOUR_ID_LABEL: flavour.id, **flavour.labels}


def test_push_pushes_and_verifies_tag_then_aliases(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    fake = FakeEngine({tag: DIGEST_A for tag in flavour.tags}, good_labels(flavour))
    patch_engine(monkeypatch, fake)
    registry, session = client([FakeResponse(200)] + [FakeResponse(200, {"Docker-Content-Digest": DIGEST_A})] * 3)
    entry = publish.push_flavour(flavour, registry.registry, registry, None)
    assert [tag for kind, tag in fake.events if kind == "push"] == list(flavour.tags)
    heads = [url.rsplit("/", 1)[1] for method, url, _, _ in session.calls if method == "HEAD"]
    assert heads == list(flavour.tags)
    # every registry-named local tag is removed again
    assert sorted(ref for kind, ref in fake.events if kind == "tag") == \
        sorted(ref for kind, ref in fake.events if kind == "untag")
    assert entry.ref == f"127.0.0.1:5999/xla-images@{DIGEST_A}" and entry.tags == flavour.tags


def manifest_of(layer_type: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": DIGEST_B,
                                  "size": 2},
                       "layers": [{"mediaType": layer_type, "digest": DIGEST_B, "size": 10}]}).encode()


@pytest.mark.parametrize("site", ["zstd", "gzip"])
def test_containerd_store_pushes_its_blobs_and_refuses_another_compression_before_any_alias(
        monkeypatch: pytest.MonkeyPatch, flavour: Target, site: str) -> None:
    # The containerd store pushes what it holds: the site's compression is checked on the pushed manifest.
    stored = "application/vnd.oci.image.layer.v1.tar+zstd"  # built while the site said zstd
    pushed = "sha256:" + hashlib.sha256(manifest_of(stored)).hexdigest()  # a manifest fetched by digest hashes to it
    fake = FakeEngine({tag: pushed for tag in flavour.tags}, good_labels(flavour), store="containerd")
    patch_engine(monkeypatch, fake)
    monkeypatch.setattr(publish.zstd_push, "push_zstd", lambda *args, **kwargs: pytest.fail("not the engine's push"))
    served = [FakeResponse(200), FakeResponse(200, {"Docker-Content-Digest": pushed}),
              FakeResponse(200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, manifest_of(stored))]
    registry, _ = client(served + [FakeResponse(200, {"Docker-Content-Digest": pushed})] * 2)
    chosen = Compression("zstd", 3) if site == "zstd" else Compression("gzip", None)
    if site == "zstd":
        entry = publish.push_flavour(flavour, registry.registry, registry, None, compression=chosen)
        assert entry.digest == pushed
        assert [tag for kind, tag in fake.events if kind == "push"] == list(flavour.tags)
        return
    with pytest.raises(Failure) as caught:
        publish.push_flavour(flavour, registry.registry, registry, None, compression=chosen)
    assert caught.value.rule == "push-compression" and "tar+zstd" in caught.value.message
    assert "no alias was pushed" in caught.value.message
    assert [tag for kind, tag in fake.events if kind == "push"] == [flavour.tag]


def test_manifest_mismatch_stops_before_any_alias(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    fake = FakeEngine({tag: DIGEST_A for tag in flavour.tags}, good_labels(flavour))
    patch_engine(monkeypatch, fake)
    registry, _ = client([FakeResponse(200), FakeResponse(200, {"Docker-Content-Digest": DIGEST_B})])
    with pytest.raises(Failure) as caught:
        publish.push_flavour(flavour, registry.registry, registry, None)
    assert caught.value.rule == "push-verified" and DIGEST_B in caught.value.message
    assert [tag for kind, tag in fake.events if kind == "push"] == [flavour.tag]


def test_manifest_missing_after_push_is_a_failure(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    patch_engine(monkeypatch, FakeEngine({flavour.tag: DIGEST_A}, good_labels(flavour)))
    registry, _ = client([FakeResponse(200), FakeResponse(404)])
    with pytest.raises(Failure, match="missing right after its push"):
        publish.push_flavour(flavour, registry.registry, registry, None)


def test_alias_with_another_digest_fails(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    digests = {flavour.tag: DIGEST_A, flavour.aliases[0]: DIGEST_B}
    patch_engine(monkeypatch, FakeEngine(digests, good_labels(flavour)))
    registry, _ = client([FakeResponse(200), FakeResponse(200, {"Docker-Content-Digest": DIGEST_A})])
    with pytest.raises(Failure, match="alias r2.9_3.11_cpu was pushed as"):
        publish.push_flavour(flavour, registry.registry, registry, None)


def test_registry_down_tags_nothing(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    fake = FakeEngine({}, good_labels(flavour))
    patch_engine(monkeypatch, fake)
    registry, _ = client([requests.ConnectionError("Connection refused")] * NO_WAIT.attempts)
    with pytest.raises(Failure, match="does not answer"):
        publish.push_flavour(flavour, registry.registry, registry, None)
    assert fake.events == []


def test_image_of_other_inputs_is_refused(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    patch_engine(monkeypatch, FakeEngine({}, {names.FLAVOUR_ID_LABEL: "sha256:" + "9" * 64}))
    registry, _ = client([])
    with pytest.raises(Failure) as caught:
        publish.push_flavour(flavour, registry.registry, registry, None)
    assert caught.value.rule == "image-built" and "build.py build" in caught.value.render()


def test_missing_image_is_refused(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    patch_engine(monkeypatch, FakeEngine({}, None))
    registry, _ = client([])
    with pytest.raises(Failure, match="not on this engine"):
        publish.push_flavour(flavour, registry.registry, registry, None)


def test_engine_errors_quoting_the_password_are_redacted(monkeypatch: pytest.MonkeyPatch, flavour: Target) -> None:
    fake = FakeEngine({}, good_labels(flavour), fail_on=flavour.tag, error_text=f"denied for ci:{SECRET}")
    patch_engine(monkeypatch, fake)
    credentials = Credentials("ci", SECRET)
    registry, _ = client([FakeResponse(200)], credentials)
    with pytest.raises(Failure) as caught:
        publish.push_flavour(flavour, registry.registry, registry, credentials)
    assert SECRET not in caught.value.render() and "denied for ci:***" in caught.value.render()


def test_push_all_records_only_verified_flavours(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first, second = make_flavour(), make_flavour(python="3.10", aliases=(), id="sha256:" + "2" * 64)
    labels = {first.tag: good_labels(first), second.tag: good_labels(second)}
    fake = FakeEngine({tag: DIGEST_A for tag in first.tags}, None, fail_on=second.tag)
    fake.image_labels = lambda ref: labels[ref.split(":", 1)[1]]  # type: ignore[method-assign]
    patch_engine(monkeypatch, fake)
    session = FakeSession([FakeResponse(200)] + [FakeResponse(200, {"Docker-Content-Digest": DIGEST_A})] * 3
                          + [FakeResponse(200)])
    monkeypatch.setattr(registry_client.requests, "Session", lambda: session)
    path = tmp_path / "published.json"
    with pytest.raises(Failure):
        publish.push_all([first, second], Registry.parse("127.0.0.1:5999/xla-images"), path,
                         retry=NO_WAIT)
    recorded = model_published.read_published(path)
    assert list(recorded) == [first.tag]


def test_push_all_refuses_up_front_when_any_image_is_not_built(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    first, second = make_flavour(), make_flavour(python="3.10", aliases=(), id="sha256:" + "2" * 64)
    fake = FakeEngine({tag: DIGEST_A for tag in first.tags}, None)
    fake.image_labels = lambda ref: good_labels(first) if first.tag in ref else None  # type: ignore[method-assign]
    patch_engine(monkeypatch, fake)
    path = tmp_path / "published.json"
    with pytest.raises(Failure, match=f"xla-images:{second.tag} is not on this engine"):
        publish.push_all([first, second], Registry.parse("127.0.0.1:5999/xla-images"), path,
                         retry=NO_WAIT)
    assert fake.events == [] and not path.exists()


# --- published.json ---------------------------------------------------------------------------------------

def entry(tag: str, digest: str, **facts: Any) -> model_published.Published:
    flavour = make_flavour(**facts)
    return model_published.Published(tag, (tag,), "127.0.0.1:5000/xla-images", digest, {}, flavour.to_json(), "now")


def test_record_published_merges_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    publish.record_published(path, [entry("a", DIGEST_A)])
    publish.record_published(path, [entry("b", DIGEST_B)])
    publish.record_published(path, [entry("a", DIGEST_B)])
    recorded = model_published.read_published(path)
    assert {tag: item.digest for tag, item in recorded.items()} == {"a": DIGEST_B, "b": DIGEST_B}
    assert [p.name for p in tmp_path.iterdir()] == ["published.json"]  # no temporary file left behind


def test_corrupt_published_json_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError) as caught:
        publish.record_published(path, [entry("a", DIGEST_A)])
    assert caught.value.rule == "published-format"
    assert path.read_text() == "{not json"  # untouched
