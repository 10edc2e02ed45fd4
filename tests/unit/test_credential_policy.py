"""Where credentials go (run/registry/policy.py), proven on real HTTP servers that record every request.

Each host is a support.host.Host, a recording server on its own loopback address (127.0.0.1 the registry, 127.0.0.2
the storage it redirects to, 127.0.0.3 its token service, 127.0.0.4 a token service a foreign challenge names,
127.0.0.5 an upload Location): different addresses are different hosts to the client. For every credential source —
the environment, a credHelpers helper, a credsStore helper, `auths` with a password, an identity token, a registry
token — the records show the secret reaching the registry and the token service its own challenge names (docker
does send basic credentials there), and nothing reaching any other host: no Authorization, no secret in a path, a
header or a body, and no request at all to a realm a foreign challenge names.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from support.host import Answer, Host, Seen

from xla_images.errors import ConfigError, Failure
from xla_images.generate.plan import load_plan
from xla_images.model.registry import Mirror, Registry
from xla_images.model import published as model_published
from xla_images.run.shipping import promote, publish
from xla_images.run import registry as registries
from xla_images.run.registry import RetryPolicy, credentials as creds, policy
from xla_images.run.registry.upload import upload_bytes

SECRET = "pw-" + os.urandom(8).hex()
IDENTITY = "refresh-" + os.urandom(8).hex()
REGISTRY_TOKEN = "regtok-" + os.urandom(8).hex()
ISSUED = "issued-" + os.urandom(8).hex()
USER = "bot"
BASIC = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
SECRETS = (SECRET, IDENTITY, REGISTRY_TOKEN, ISSUED, BASIC)
BLOB = b"layer bytes"
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()
ROOT = Path(__file__).resolve().parents[2]
NO_WAIT = RetryPolicy(attempts=1, first_wait=0.0, max_wait=0.0)
SOURCES = ("environment", "credHelpers", "credsStore", "auths", "identitytoken", "registrytoken")


@pytest.fixture
def hosts() -> Iterator[Callable[..., Host]]:
    started: list[Host] = []

    def start(address: str, route: Callable[[Seen], Answer] | None = None) -> Host:
        started.append(Host(address, route).start())
        return started[-1]

    yield start
    for each in started:
        each.close()


# --- the registry, its token service, and the hosts that must get nothing ---------------------------------

def token_service(seen: Seen) -> Answer:
    """Grants a token to the right basic credentials or identity token, nothing to anyone else."""
    ok = seen.headers.get("authorization") == f"Basic {BASIC}" or \
        parse_qs(seen.body.decode()).get("refresh_token") == [IDENTITY]
    return (200, {}, json.dumps({"token": ISSUED, "expires_in": 300}).encode()) if ok else (401, {}, b"")


def registry_route(realm: str, storage: str, upload: str) -> Callable[[Seen], Answer]:
    """Token auth (a challenge naming `realm`, or a registry token as is); reads redirect to `storage`,
    uploads are opened at `upload`."""
    def route(seen: Seen) -> Answer:
        if seen.headers.get("authorization") not in (f"Bearer {ISSUED}", f"Bearer {REGISTRY_TOKEN}"):
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="reg"'}, b""
        if "/blobs/uploads/" in seen.path:
            return 202, {"Location": f"{upload}/upload/1?state=a"}, b""
        if seen.method == "HEAD" and "/blobs/" in seen.path:
            return 404, {}, b""  # promote's destination lacks the blob
        if "/blobs/" in seen.path or "/manifests/" in seen.path:
            return 307, {"Location": f"{storage}{seen.path}?signature=public"}, b""
        return 200, {}, b"{}"
    return route


def challenging(foreign_realm: str) -> Callable[[Seen], Answer]:
    """A host that wants credentials of its own: its challenge names another token service."""
    return lambda seen: (401, {"WWW-Authenticate": f'Bearer realm="{foreign_realm}",service="evil"'}, b"")


def serving(seen: Seen) -> Answer:
    """Storage behind signed URLs: serves anyone; takes upload chunks."""
    if seen.method == "PATCH":
        return 202, {"Location": seen.path}, b""
    if seen.method == "PUT":
        return 201, {}, b""
    return 200, {"Docker-Content-Digest": DIGEST, "Content-Type": "application/octet-stream"}, BLOB


@dataclass
class Stage:
    registry: Host
    storage: Host
    realm: Host
    foreign_realm: Host
    upload: Host


@pytest.fixture
def stage(hosts: Callable[..., Host]) -> Stage:
    realm = hosts("127.0.0.3", token_service)
    foreign = hosts("127.0.0.4", token_service)  # would grant a token to the leaked credentials
    storage = hosts("127.0.0.2", challenging(f"{foreign.url}/token"))
    upload = hosts("127.0.0.5", serving)
    registry = hosts("127.0.0.1")
    registry.route = registry_route(f"{realm.url}/token", storage.url, upload.url)
    return Stage(registry, storage, realm, foreign, upload)


def use_source(source: str, registry_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `source` hold the credentials for `registry_host`, as a user would."""
    for name in (creds.USER_ENV, creds.PASSWORD_ENV, policy.ENVIRONMENT_REGISTRY):
        monkeypatch.delenv(name, raising=False)
    config: dict[str, object] = {}
    if source == "environment":
        monkeypatch.setenv(creds.USER_ENV, USER)
        monkeypatch.setenv(creds.PASSWORD_ENV, SECRET)
    elif source in ("credHelpers", "credsStore"):
        write_helper(tmp_path / "bin", "rec", f"echo '{json.dumps({'Username': USER, 'Secret': SECRET})}'")
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        config = {"credHelpers": {registry_host: "rec"}} if source == "credHelpers" else {"credsStore": "rec"}
    elif source == "auths":
        config = {"auths": {registry_host: {"auth": BASIC}}}
    elif source == "identitytoken":
        config = {"auths": {registry_host: {"identitytoken": IDENTITY}}}
    else:
        config = {"auths": {registry_host: {"registrytoken": REGISTRY_TOKEN}}}
    (tmp_path / "docker").mkdir(parents=True, exist_ok=True)
    (tmp_path / "docker" / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))


def write_helper(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / f"docker-credential-{name}"
    path.write_text(f"#!/bin/sh\nread host\n{body}\n")
    path.chmod(0o755)
    return path


def connect(registry: Host, actions: str = registries.READ) -> registries.RegistryClient:
    return registries.connect(Registry(registry.host, "repo"), actions, named=(registry.host,), retry=NO_WAIT)


def assert_only_the_registry_and_its_realm_got_secrets(stage: Stage, source: str) -> None:
    for other in (stage.storage, stage.foreign_realm, stage.upload):
        assert other.authorizations() == [] and other.leaks(SECRETS) == [], other.address
    assert stage.foreign_realm.seen == []  # a foreign challenge is never answered, not even anonymously
    if source != "registrytoken":  # the realm the registry's own challenge names gets them, as docker sends them
        assert stage.realm.leaks(SECRETS) and not set(stage.realm.leaks(SECRETS)) - {SECRET, BASIC, IDENTITY}
    assert stage.registry.leaks(SECRETS)  # the credentials were in play: the registry got its token


# --- reads redirected to another host ----------------------------------------------------------------------

@pytest.mark.parametrize("source", SOURCES)
def test_a_redirect_target_that_challenges_gets_no_credential_and_no_answer(
        source: str, stage: Stage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_source(source, stage.registry.host, tmp_path, monkeypatch)
    client = connect(stage.registry)
    with pytest.raises(Failure) as caught:
        client.request("GET", f"/v2/repo/blobs/{DIGEST}")
    assert caught.value.rule == "registry-redirect" and stage.storage.host in caught.value.message
    with pytest.raises(Failure) as caught:
        client.manifest_bytes("latest")
    assert caught.value.rule == "registry-redirect"
    assert_only_the_registry_and_its_realm_got_secrets(stage, source)
    assert all(secret not in caught.value.render() for secret in SECRETS)


def test_a_pull_mirror_that_redirects_keeps_its_credentials(stage: Stage, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror's credentials (docker config, traded for a bearer token) go to the mirror and its realm; its
    storage asks for credentials of its own and gets none (the preflight's HEAD is refused, not answered)."""
    use_source("auths", stage.registry.host, tmp_path, monkeypatch)
    mirror = Mirror(stage.registry.host)
    client = registries.connect(mirror.registry_for(Registry("origin.example", "repo")), retry=NO_WAIT,
                                docker_config_only=True)
    with pytest.raises(Failure) as caught:
        client.manifest_digest(DIGEST)
    assert caught.value.rule == "registry-redirect"
    assert f"Bearer {ISSUED}" in stage.registry.authorizations()
    assert_only_the_registry_and_its_realm_got_secrets(stage, "auths")


# --- promote: a blob read from one host, uploaded to a Location on another -----------------------------------

@pytest.mark.parametrize("source", ("environment", "credHelpers", "identitytoken", "registrytoken"))
def test_promote_copies_a_blob_through_foreign_hosts_without_credentials(
        source: str, stage: Stage, hosts: Callable[..., Host], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    stage.storage.route = serving
    use_source(source, stage.registry.host, tmp_path, monkeypatch)
    source_client = connect(stage.registry)
    destination = hosts("127.0.0.6")  # the same registry behaviour, its own host; the same credential source
    destination.route = registry_route(f"{stage.realm.url}/token", stage.storage.url, stage.upload.url)
    use_source(source, destination.host, tmp_path / "destination", monkeypatch)
    destination_client = connect(destination, registries.WRITE)
    transfer = promote.Transfer()
    promote.BlobCopier(source_client, destination_client).copy(DIGEST, len(BLOB), transfer)
    assert transfer.copied == 1
    assert [seen.method for seen in stage.upload.seen] == ["PUT"] and stage.upload.seen[0].body == BLOB
    assert_only_the_registry_and_its_realm_got_secrets(stage, source)
    assert destination.leaks(SECRETS)


def test_an_upload_location_that_challenges_gets_no_credential(stage: Stage, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stage.upload.route = challenging(f"{stage.foreign_realm.url}/token")
    use_source("auths", stage.registry.host, tmp_path, monkeypatch)
    with pytest.raises(Failure) as caught:
        upload_bytes(connect(stage.registry, registries.WRITE), DIGEST, [BLOB], "promote-blob")
    assert caught.value.rule == "registry-redirect" and stage.upload.host in caught.value.message
    assert_only_the_registry_and_its_realm_got_secrets(stage, "auths")


# --- the token service ---------------------------------------------------------------------------------------

def test_an_identity_token_is_not_resent_where_the_realm_redirects(stage: Stage, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The POST that trades the identity token carries it in its body: a redirect of it is not followed."""
    stage.realm.route = lambda seen: (307, {"Location": f"{stage.foreign_realm.url}/token"}, b"")
    use_source("identitytoken", stage.registry.host, tmp_path, monkeypatch)
    with pytest.raises(Failure) as caught:
        connect(stage.registry).check_reachable()
    assert caught.value.rule == "registry-auth"
    assert stage.foreign_realm.seen == [] and IDENTITY in stage.realm.seen[0].body.decode()


def test_a_huge_expires_in_is_a_token_kept_a_day(stage: Stage, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    stage.realm.route = lambda seen: (200, {}, b'{"token": "%s", "expires_in": 1%s}' % (ISSUED.encode(), b"0" * 400))
    use_source("auths", stage.registry.host, tmp_path, monkeypatch)
    client = connect(stage.registry)
    client.check_reachable()
    client.check_reachable()
    assert len(stage.realm.seen) == 1  # cached, not refetched: the lifetime is capped, not dropped


def test_cookies_a_registry_sets_go_nowhere(stage: Stage, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A cookie jar ignores ports: a cookie 127.0.0.1:A sets would reach 127.0.0.1:B. Docker keeps none."""
    other = Host("127.0.0.1", serving).start()
    try:
        stage.registry.route = lambda seen: (
            (307, {"Location": f"{other.url}/blob", "Set-Cookie": f"session={SECRET}; Path=/"}, b"")
            if "/blobs/" in seen.path else (200, {"Set-Cookie": f"session={SECRET}; Path=/"}, b"{}"))
        use_source("auths", stage.registry.host, tmp_path, monkeypatch)
        client = connect(stage.registry)
        client.check_reachable()
        assert client.request("GET", f"/v2/repo/blobs/{DIGEST}").content == BLOB
        assert other.leaks(SECRETS) == [] and all("cookie" not in seen.headers for seen in stage.registry.seen)
    finally:
        other.close()


# --- the environment's credentials are bound to one registry ------------------------------------------------

def basic_registry(seen: Seen) -> Answer:
    ok = seen.headers.get("authorization") == f"Basic {BASIC}"
    return (200, {}, b"{}") if ok else (401, {"WWW-Authenticate": 'Basic realm="r"'}, b"")


@pytest.mark.parametrize("bound_by", ("XLA_IMAGES_REGISTRY", "the command"))
def test_environment_credentials_go_only_to_the_registry_they_were_given_for(
        bound_by: str, hosts: Callable[..., Host], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours, elsewhere = hosts("127.0.0.1", basic_registry), hosts("127.0.0.2", basic_registry)
    use_source("environment", ours.host, tmp_path, monkeypatch)
    named: tuple[str, ...] = (ours.host,)
    if bound_by == "XLA_IMAGES_REGISTRY":
        monkeypatch.setenv(policy.ENVIRONMENT_REGISTRY, f"{ours.host}/xla-images")
        named = ()
    registries.connect(Registry(ours.host, "repo"), named=named, retry=NO_WAIT).check_reachable()
    # A host only published.json names: anonymous (its own docker-config credentials, if it had any).
    stranger = registries.connect(Registry(elsewhere.host, "repo"), named=named, retry=NO_WAIT)
    assert stranger.credentials is None
    with pytest.raises(Failure) as caught:
        stranger.check_reachable()
    assert caught.value.rule == "registry-auth"
    assert ours.authorizations() == [f"Basic {BASIC}"] and elsewhere.leaks(SECRETS) == []


def test_resolve_offers_no_environment_credential_to_the_host_a_published_json_names(
        hosts: Callable[..., Host], tmp_path: Path) -> None:
    """The CLI end to end: the site's registry is another host, so the published.json's host gets the
    environment's credentials only once XLA_IMAGES_REGISTRY names it."""
    elsewhere = hosts("127.0.0.2", basic_registry)
    flavour = load_plan(ROOT / "matrix.yaml").flavours[0]
    path = tmp_path / "published.json"
    publish.record_published(path, [model_published.Published(flavour.tag, flavour.tags, f"{elsewhere.host}/xla-images",
                                                      DIGEST, {}, flavour.to_json(), "now")])
    env = {key: value for key, value in os.environ.items() if not key.startswith("XLA_IMAGES_REGISTRY")}
    env.update({creds.USER_ENV: USER, creds.PASSWORD_ENV: SECRET, "DOCKER_CONFIG": str(tmp_path / "none")})
    command = [sys.executable, str(ROOT / "build.py"), "resolve", "--published", str(path),
               "--matrix", str(ROOT / "matrix.yaml"), "--set", "registry=127.0.0.1:1/site"]
    for bound in (False, True):
        if bound:
            env[policy.ENVIRONMENT_REGISTRY] = f"{elsewhere.host}/xla-images"
        elsewhere.seen.clear()
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in result.stderr and SECRET not in result.stdout + result.stderr
        assert elsewhere.seen, result.stderr  # it was asked (the re-verification)
        assert set(elsewhere.leaks(SECRETS)) == ({BASIC} if bound else set()), bound


def test_xla_images_registry_must_name_a_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {creds.USER_ENV: USER, creds.PASSWORD_ENV: SECRET, policy.ENVIRONMENT_REGISTRY: "not a host/x"}
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials("h.example", env, Path("/nonexistent"))
    assert caught.value.rule == "registry-format" and SECRET not in caught.value.render()


# --- credential helpers: where they are looked up, what their failures show --------------------------------

@pytest.mark.parametrize("element", ["", "."])
def test_a_helper_in_the_current_directory_is_never_run(element: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    write_helper(tmp_path / "cwd", "planted", f"touch {marker}; echo '{{\"Username\": \"u\", \"Secret\": \"s\"}}'")
    monkeypatch.chdir(tmp_path / "cwd")
    env = {"PATH": f"{element}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"credsStore": "planted"}))
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials("h.example", env, config)
    assert "not on PATH" in caught.value.message and "current directory" in caught.value.message
    assert not marker.exists()
    # An absolute directory later on PATH still supplies a real helper of that name.
    write_helper(tmp_path / "bin", "planted", "echo '{\"Username\": \"real\", \"Secret\": \"s\"}'")
    env["PATH"] += f"{os.pathsep}{tmp_path / 'bin'}"
    found = creds.load_credentials("h.example", env, config)
    assert found is not None and found.username == "real" and not marker.exists()


@pytest.mark.parametrize(("said", "stream"), [
    (f"echo '{json.dumps({'Username': USER, 'Secret': SECRET})}'", "stdout"),
    (f"echo 'error: password={SECRET} rejected' >&2", "stderr"),
    (f"echo 'token {SECRET} has expired' >&2", "stderr"),
    ("echo 'login failed for hunter2' >&2", "a short bare secret"),
], ids=["stdout", "stderr-password", "stderr-token", "short-bare-secret"])  # not the secret: it is new each run
def test_a_failing_helper_is_named_with_its_exit_code_and_a_redacted_line(said: str, stream: str,
                                                                          tmp_path: Path) -> None:
    write_helper(tmp_path / "bin", "broken", f"{said}\nexit 3")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"credHelpers": {"h.example": "broken"}}))
    with pytest.raises(Failure) as caught:
        creds.load_credentials("h.example", {"PATH": str(tmp_path / "bin")}, config)
    text = caught.value.render()
    assert "docker-credential-broken" in text and "exit 3" in text and caught.value.rule == "registry-credentials"
    assert SECRET not in text and "hunter2" not in text, stream


def test_a_docker_config_that_is_not_a_directory_is_one_warning(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    not_a_directory = tmp_path / "docker-config"
    not_a_directory.write_text("{}")
    env = {"DOCKER_CONFIG": str(not_a_directory)}
    assert creds.load_credentials("h.example", env) is None
    assert creds.load_credentials("h.example", env) is None
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "is not a directory" in err and str(not_a_directory) in err


# --- one URL, one host (issue 41): each tricky form, on real sockets ------------------------------------------
#
# A registry (127.0.0.1) answers a redirect, an upload Location, or its token service (127.0.0.3) a redirect, with
# one URL form; 127.0.0.2 and [::1] are other hosts that record everything. Whatever the form, the host that
# gets the request is the host the policy judged: the registry with its token, another host with no credential
# at all, or nobody, the URL refused (`url-ambiguous`) before any connection.

@dataclass(frozen=True)
class Form:
    id: str
    # {own}, {ownaddress}, {ownport}: the host whose answer the URL is (the registry; its token service for a
    # realm's redirect);
    # {other}, {otherport}, {otherint}: 127.0.0.2; {other6}: [::1]
    template: str
    lands: str  # "refused" (before any connection), "own", "other" or "other6"


FORMS = (
    Form("backslash-in-authority", "http://{other}\\@{own}/landed", "refused"),
    Form("backslash-network-path", "\\\\{other}/landed", "refused"),
    Form("backslash-in-path", "/\\{other}/landed", "refused"),
    Form("percent-5c-userinfo", "http://{other}%5C@{own}/landed", "refused"),
    Form("tab", "http://{other}\t@{own}/landed", "refused"),
    Form("space", "http://{other} @{own}/landed", "refused"),
    Form("raw-non-ascii", "http://{other}\u00e9@{own}/landed", "refused"),
    Form("userinfo", "http://user:pw@{own}/landed", "refused"),
    Form("at-registry-then-other", "http://{own}@{other}/landed", "refused"),
    Form("two-ats", "http://a@{own}@{other}/landed", "refused"),
    Form("integer-ip", "http://{otherint}:{otherport}/landed", "refused"),
    Form("short-ip", "http://127.2:{otherport}/landed", "refused"),
    Form("octal-ip", "http://0177.0.0.2:{otherport}/landed", "refused"),
    Form("trailing-dot-ip", "http://{ownaddress}.:{ownport}/landed", "refused"),
    Form("zone-id", "http://[::1%25lo]:{otherport}/landed", "refused"),
    Form("fragment-then-at", "http://{other}#@{own}/landed", "other"),
    Form("query-then-at", "http://{other}?@{own}/landed", "other"),
    Form("network-path", "//{other}/landed", "other"),
    Form("ipv6-loopback", "http://{other6}/landed", "other6"),
    Form("scheme-upper-case", "HTTP://{own}/landed", "own"),
    Form("port-leading-zero", "http://{ownaddress}:0{ownport}/landed", "own"),
    Form("absolute-path", "/landed?x=1#frag", "own"),
)


@dataclass
class Tricky:
    registry: Host
    realm: Host
    other: Host
    other6: Host

    def own(self, vehicle: str) -> Host:
        return self.realm if vehicle == "token-realm-redirect" else self.registry

    def text(self, form: Form, vehicle: str) -> str:
        own = self.own(vehicle)
        return form.template.format(own=own.host, ownaddress=own.address, ownport=own.port,
                                    other=self.other.host,
                                    otherport=self.other.port, otherint=0x7F000002,
                                    other6=self.other6.host)

    def landed(self, form: Form, vehicle: str) -> list[Seen]:
        """The requests the form's URL brought to the host it names (to the other hosts: any request at all)."""
        if form.lands == "own":
            return [seen for seen in self.own(vehicle).seen if seen.path.startswith("/landed")]
        return self.other6.seen if form.lands == "other6" else self.other.seen


def tricky_registry(realm: str, location: str) -> Callable[[Seen], Answer]:
    """Token auth; reads, tag lists and uploads all sent to `location`; `/landed` served as storage would."""
    def route(seen: Seen) -> Answer:
        if seen.path.startswith("/landed"):
            return serving(seen)
        if seen.headers.get("authorization") != f"Bearer {ISSUED}":
            return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="reg"'}, b""
        if "/blobs/uploads/" in seen.path:
            return 202, {"Location": location}, b""
        if seen.method == "HEAD" and "/blobs/" in seen.path:
            return 404, {}, b""  # promote's destination lacks the blob
        if seen.path.startswith("/v2/repo"):
            return 307, {"Location": location}, b""
        return 200, {}, b"{}"
    return route


def resolve_head(client: registries.RegistryClient) -> None:
    client.manifest_digest("latest")  # resolve's re-verification, pull's and promote's look-up


def pull_get(client: registries.RegistryClient) -> None:
    client.manifest_bytes("latest")  # pull's and promote's manifest read


def prune_tags(client: registries.RegistryClient) -> None:
    client.tag_digests()  # prune's tag list, then one HEAD per tag


def push_upload(client: registries.RegistryClient) -> None:
    upload_bytes(client, DIGEST, [BLOB], "push")  # the zstd push's and promote's upload: POST, PUT (DELETE)


def promote_copy(client: registries.RegistryClient) -> None:
    source = registries.connect(Registry(client.registry.host, "repo"), named=(client.registry.host,),
                                retry=NO_WAIT)
    promote.BlobCopier(source, client).copy(DIGEST, len(BLOB), promote.Transfer())  # mount, GET, PUT, DELETE


VEHICLES = {"resolve-redirect": resolve_head, "pull-redirect": pull_get, "prune-redirect": prune_tags,
            "push-upload-location": push_upload, "promote-blob-copy": promote_copy,
            "token-realm-redirect": resolve_head}


@pytest.mark.parametrize("vehicle", VEHICLES)
@pytest.mark.parametrize("form", FORMS, ids=[form.id for form in FORMS])
def test_credentials_reach_only_the_host_the_policy_judged(form: Form, vehicle: str, hosts: Callable[..., Host],
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = Tricky(hosts("127.0.0.1"), hosts("127.0.0.3", token_service), hosts("127.0.0.2", serving),
                   hosts("::1", serving))
    location = stage.text(form, vehicle)
    stage.registry.route = tricky_registry(f"{stage.realm.url}/token", location)
    if vehicle == "token-realm-redirect":
        stage.realm.route = lambda seen: (307, {"Location": location}, b"")
    use_source("environment", stage.registry.host, tmp_path, monkeypatch)
    client = registries.connect(Registry(stage.registry.host, "repo"), registries.DELETE,
                                named=(stage.registry.host,), retry=NO_WAIT)
    try:
        VEHICLES[vehicle](client)
        failure = None
    except Failure as caught:
        failure = caught
    for other in (stage.other, stage.other6):  # never a credential, whatever the form
        assert other.authorizations() == [] and other.leaks(SECRETS) == [], \
            (other.address, [s.path for s in other.seen])
    if form.lands == "refused":
        assert failure is not None and failure.rule == "url-ambiguous", failure and failure.render()
        assert stage.other.seen == stage.other6.seen == [] and stage.landed(form, vehicle) == []
        assert all(secret not in failure.render() for secret in SECRETS) and "\n" not in failure.message
        return
    assert failure is None or failure.rule != "url-ambiguous", failure.render()
    assert stage.landed(form, vehicle), f"the request did not reach {form.lands}"
    if form.lands == "own":
        # The policy kept the credential for the answering host's origin, and the connection went there.
        kept = f"Basic {BASIC}" if vehicle == "token-realm-redirect" else f"Bearer {ISSUED}"
        assert all(seen.headers.get("authorization") == kept for seen in stage.landed(form, vehicle))


def test_a_refused_registry_answer_is_exit_1_with_one_line_naming_the_rule(hosts: Callable[..., Host],
                                                                          tmp_path: Path) -> None:
    """`build.py resolve` against a registry whose manifests redirect to `http://OTHER\\@REGISTRY/...`: the
    environment's password reached the registry's realm only, the other host got no request at all."""
    realm, other = hosts("127.0.0.3", token_service), hosts("127.0.0.2", serving)
    registry = hosts("127.0.0.1")
    registry.route = tricky_registry(f"{realm.url}/token", f"http://{other.host}\\@{registry.host}/landed")
    flavour = load_plan(ROOT / "matrix.yaml").flavours[0]
    path = tmp_path / "published.json"
    publish.record_published(path, [model_published.Published(flavour.tag, flavour.tags, f"{registry.host}/repo",
                                                      DIGEST, {}, flavour.to_json(), "now")])
    env = {key: value for key, value in os.environ.items() if not key.startswith("XLA_IMAGES_REGISTRY")}
    env.update({creds.USER_ENV: USER, creds.PASSWORD_ENV: SECRET, "DOCKER_CONFIG": str(tmp_path / "none"),
                policy.ENVIRONMENT_REGISTRY: f"{registry.host}/repo"})
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "resolve", "--published", str(path),
                             "--matrix", str(ROOT / "matrix.yaml")], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if "[url-ambiguous]" in line], result.stderr
    assert SECRET not in result.stdout + result.stderr and BASIC not in result.stdout + result.stderr
    assert other.seen == [] and realm.leaks(SECRETS) and registry.leaks(SECRETS)


@pytest.mark.parametrize("template", ["http://{other}\\@{realm}/token", "http://{other} @{realm}/token",
                                      "http://{realm}@{other}/token", "http://2130706434:{otherport}/token"],
                         ids=["backslash", "space", "userinfo", "integer-ip"])
def test_a_token_realm_that_could_name_two_hosts_is_never_asked(
        template: str, hosts: Callable[..., Host], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The realm the registry's own challenge names gets the basic credentials (rule 2): only when it is read
    one way. Otherwise the challenge is refused before the token request, and no host gets the password."""
    realm, other = hosts("127.0.0.3", token_service), hosts("127.0.0.2", token_service)
    named = template.format(other=other.host, realm=realm.host, otherport=other.port)
    quoted = named.replace("\\", "\\\\")  # a quoted-string's escape: the challenge's realm holds one backslash
    registry = hosts("127.0.0.1", lambda seen: (401, {"WWW-Authenticate": f'Bearer realm="{quoted}"'}, b""))
    use_source("environment", registry.host, tmp_path, monkeypatch)
    with pytest.raises(Failure) as caught:
        connect(registry).check_reachable()
    assert caught.value.rule == "url-ambiguous" and SECRET not in caught.value.render()
    assert other.seen == [] and realm.seen == []
