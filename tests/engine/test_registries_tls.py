"""Every command that talks to a registry, against registries as users have them (registries_support): TLS
with a private CA, htpasswd and token auth, a client-certificate registry, credentials inline, in a
credsStore and in credHelpers; the CA in the engine's certs.d, and again only in an environment-named bundle.

One registry process per configuration, shared by the module; images are FROM-scratch flavours of a
throw-away matrix (publish_support's), so a whole lifecycle costs seconds. No output, file, label or
published.json may hold a secret.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import requests

import registries_support as support
from publish_support import build_image, make_project
from xla_images import names
from xla_images.run import engine

STAGE_USER, STAGE_PASSWORD = "stage-bot", "stage-" + os.urandom(12).hex()
PROD_USER, PROD_PASSWORD = "prod-bot", "prod-" + os.urandom(12).hex()
IDENTITY_TOKEN = "refresh-" + os.urandom(12).hex()
KEY_PASSWORD = support.KEY_PASSWORD
SECRETS = (STAGE_PASSWORD, PROD_PASSWORD, KEY_PASSWORD, IDENTITY_TOKEN,
           base64.b64encode(f"{STAGE_USER}:{STAGE_PASSWORD}".encode()).decode(),
           base64.b64encode(f"{PROD_USER}:{PROD_PASSWORD}".encode()).decode())


# --- fixtures: one of each registry for the module -----------------------------------------------------------

pki = support.pki_fixture("the registries tests")


@pytest.fixture(scope="module")
def staging(pki: support.Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.TlsRegistry]:
    """TLS + htpasswd."""
    directory = tmp_path_factory.mktemp("staging")
    htpasswd = support.write_htpasswd(directory / "htpasswd", {STAGE_USER: STAGE_PASSWORD})
    with support.running_registry(pki, directory, auth="htpasswd", htpasswd=htpasswd) as registry:
        yield registry


@pytest.fixture(scope="module")
def token_server(pki: support.Pki) -> Iterator[support.TokenServer]:
    server = support.TokenServer(pki, {PROD_USER: PROD_PASSWORD}, {IDENTITY_TOKEN}).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def production(pki: support.Pki, token_server: support.TokenServer,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.TlsRegistry]:
    """TLS + token auth (the registry checks the JWTs our token server issues)."""
    with support.running_registry(pki, tmp_path_factory.mktemp("production"), auth="token",
                                  token=token_server) as registry:
        yield registry


@pytest.fixture(scope="module")
def mtls(pki: support.Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.TlsRegistry]:
    """TLS that wants a client certificate signed by the CA, + htpasswd."""
    directory = tmp_path_factory.mktemp("mtls")
    htpasswd = support.write_htpasswd(directory / "htpasswd", {STAGE_USER: STAGE_PASSWORD})
    with support.running_registry(pki, directory, auth="htpasswd", htpasswd=htpasswd,
                                  client_cas=True) as registry:
        yield registry


@pytest.fixture(scope="module")
def cosign_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("cosign")
    subprocess.run(["cosign", "generate-key-pair"], cwd=directory, check=True, capture_output=True,
                   env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD}, stdin=subprocess.DEVNULL, timeout=60)
    return {"key": directory / "cosign.key", "pub": directory / "cosign.pub"}


# --- helpers -------------------------------------------------------------------------------------------------

def stage_session(registry: support.TlsRegistry, pki: support.Pki) -> requests.Session:
    """The test's own reader of the htpasswd registry (plain requests, not the code under test)."""
    session = requests.Session()
    session.trust_env = False  # else REQUESTS_CA_BUNDLE overrides `verify`
    session.verify = str(pki.ca)
    session.auth = (STAGE_USER, STAGE_PASSWORD)
    return session


def digest_at(session: requests.Session, base: str, repository: str, reference: str,
              headers: dict[str, str] | None = None) -> str | None:
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                        "application/vnd.oci.image.manifest.v1+json", **(headers or {})}
    response = session.head(f"{base}/v2/{repository}/manifests/{reference}", headers=accept, timeout=10)
    return None if response.status_code == 404 else response.headers["Docker-Content-Digest"]


def layer_types(session: requests.Session, base: str, repository: str, digest: str,
                headers: dict[str, str] | None = None) -> set[str]:
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                        "application/vnd.oci.image.manifest.v1+json", **(headers or {})}
    response = session.get(f"{base}/v2/{repository}/manifests/{digest}", headers=accept, timeout=10)
    response.raise_for_status()
    return {layer["mediaType"] for layer in response.json()["layers"]}


def put_dated_nightly(session: requests.Session, base: str, repository: str, tag: str) -> str:
    """A second, tiny manifest (no layers) under a dated nightly tag: what prune must delete."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    start = session.post(f"{base}/v2/{repository}/blobs/uploads/", timeout=10)
    location = start.headers["Location"]
    location = location if location.startswith("https://") else base + location
    done = session.put(location, params={"digest": config_digest}, data=config,
                       headers={"Content-Type": "application/octet-stream"}, timeout=10)
    assert done.status_code == 201, done.text
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                      "size": len(config), "digest": config_digest}, "layers": []}).encode()
    put = session.put(f"{base}/v2/{repository}/manifests/{tag}", data=manifest,
                      headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=10)
    assert put.status_code == 201, put.text
    return str(put.headers["Docker-Content-Digest"])


def assert_no_secret(client: support.Client, *roots: Path) -> None:
    texts = list(client.outputs)
    for root in roots:
        texts += [text for _, text in support.iter_texts(root)]
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


# --- the whole lifecycle -------------------------------------------------------------------------------------

# Every credential source and trust with the default compression (zstd, the toolkit's push), and the engine's
# gzip push once: the same lifecycle must hold for both layer formats.
LIFECYCLES = [pytest.param(trust, mode, "zstd", id=f"{mode}-{trust}")
              for trust in ("certs.d", "bundle") for mode in ("auths", "credsStore", "credHelpers")]
LIFECYCLES.append(pytest.param("certs.d", "auths", "gzip", id="auths-certs.d-gzip"))
LAYER_TYPES = {"zstd": {"application/vnd.oci.image.layer.v1.tar+zstd"},
               "gzip": {"application/vnd.docker.image.rootfs.diff.tar.gzip"}}


@pytest.mark.parametrize(("trust", "mode", "compression"), LIFECYCLES)
def test_push_resolve_pull_promote_sign_verify_prune(trust: str, mode: str, compression: str, pki: support.Pki,
                                                     staging: support.TlsRegistry, production: support.TlsRegistry,
                                                     token_server: support.TokenServer,
                                                     cosign_keys: dict[str, Path], tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    with (project.root / "site.yaml").open("a", encoding="utf-8") as site:
        site.write(f"compression: {{format: {compression}}}\n")
    flavour = project.flavour
    image_id = build_image(tmp_path / "ctx", flavour, (1,), compression)
    client = support.Client(project, tmp_path, pki, trust)
    client.login(mode, staging.host, STAGE_USER, STAGE_PASSWORD)
    client.login(mode, production.host, PROD_USER, PROD_PASSWORD)
    repository = f"stage-{mode.lower()}-{trust.replace('.', '')}-{compression}"
    target = f"{staging.host}/{repository}"
    reader = stage_session(staging, pki)
    base = f"https://{staging.host}"
    pulled_ref = None
    try:
        client("push", flavour.tag, "--registry", target)
        entry = json.loads(project.published.read_text())["flavours"][flavour.tag]
        digest = entry["digest"]
        assert {tag: digest_at(reader, base, repository, tag) for tag in flavour.tags} == \
            {tag: digest for tag in flavour.tags}  # tag and aliases, as the registry itself answers
        assert layer_types(reader, base, repository, digest) == LAYER_TYPES[compression]

        assert client("resolve", "--python", "3.11").stdout.strip() == f"{target}@{digest}"
        assert client("resolve", "--python", "3.11", "--registry", target).stdout.strip() == f"{target}@{digest}"

        engine.images.remove_image(names.local_ref(flavour.tag), force=True)
        pulled = client("pull", "--python", "3.11")
        pulled_ref = pulled.stdout.strip()
        attrs = engine.images.image_inspect(pulled_ref)
        assert attrs is not None and attrs["Id"] == image_id
        assert all(secret not in json.dumps(attrs) for secret in SECRETS)  # labels and all

        destination = f"{production.host}/prod-{mode.lower()}-{trust.replace('.', '')}-{compression}"
        promoted = client("promote", flavour.tag, "--from", target, "--to", destination)
        assert f"{destination}@{digest}" in promoted.stdout
        token = token_server.jwt({"iss": support.ISSUER, "aud": support.SERVICE, "sub": "test", "exp": 2 ** 31,
                                  "nbf": 0, "iat": 0, "jti": "t", "access": [
                                      {"type": "repository", "name": destination.split("/", 1)[1],
                                       "actions": ["pull"]}]})
        prod_reader = requests.Session()
        prod_reader.trust_env = False
        prod_reader.verify = str(pki.ca)
        for tag in flavour.tags:
            assert digest_at(prod_reader, f"https://{production.host}", destination.split("/", 1)[1], tag,
                             {"Authorization": f"Bearer {token}"}) == digest
        assert layer_types(prod_reader, f"https://{production.host}", destination.split("/", 1)[1], digest,
                           {"Authorization": f"Bearer {token}"}) == LAYER_TYPES[compression]

        client("sign", flavour.tag, "--key", str(cosign_keys["key"]), "--no-sbom")
        verified = client("verify", flavour.tag, "--key", str(cosign_keys["pub"]), "--no-sbom")
        assert flavour.tag in verified.stdout + verified.stderr

        old = put_dated_nightly(reader, base, repository, "nightly_3.11_cpu_20200101")
        pruned = client("prune", "--registry", target, "--keep", "0", "--older-than", "1", "--no-gc", "--json")
        report = json.loads(pruned.stdout)
        assert report["deleted_digests"] == [old]
        assert digest_at(reader, base, repository, "nightly_3.11_cpu_20200101") is None
        assert digest_at(reader, base, repository, flavour.tag) == digest  # published: protected

        merged = client("published", "merge", str(project.published), "-o", str(tmp_path / "merged.json"))
        assert f"{target}@{digest}" in merged.stdout
        assert_no_secret(client, project.root, tmp_path / "merged.json")
    finally:
        if pulled_ref:
            engine.images.remove_image(pulled_ref, force=True)
        engine.images.remove_image(names.local_ref(flavour.tag), force=True)


def test_an_identity_token_from_a_helper_serves_promote_resolve_and_the_engine_pull(
        pki: support.Pki, staging: support.TlsRegistry, production: support.TlsRegistry, tmp_path: Path) -> None:
    """gcloud-style: the helper answers the user `<token>`, a refresh token the token service trades (POST
    grant_type=refresh_token) — by the toolkit for promote and resolve, by the engine for the pull."""
    project = make_project(tmp_path / "project")
    image_id = build_image(tmp_path / "ctx", project.flavour, (1,))
    client = support.Client(project, tmp_path, pki, "certs.d")
    client.login("auths", staging.host, STAGE_USER, STAGE_PASSWORD)
    client.login("credHelpers", production.host, "<token>", IDENTITY_TOKEN)
    source, target = f"{staging.host}/to-identity", f"{production.host}/identity"
    pulled_ref = None
    try:
        client("push", project.flavour.tag, "--registry", source)
        digest = json.loads(project.published.read_text())["flavours"][project.flavour.tag]["digest"]
        client("promote", project.flavour.tag, "--from", source, "--to", target)
        assert client("resolve", "--registry", target).stdout.strip() == f"{target}@{digest}"
        engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)
        pulled_ref = client("pull", "--registry", target).stdout.strip()
        attrs = engine.images.image_inspect(pulled_ref)
        assert pulled_ref == f"{target}@{digest}" and attrs is not None and attrs["Id"] == image_id
        assert_no_secret(client, project.root)
    finally:
        if pulled_ref:
            engine.images.remove_image(pulled_ref, force=True)
        engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)


# --- what goes wrong, said clearly ---------------------------------------------------------------------------

def test_a_wrong_password_is_one_error_naming_the_credential_source(pki: support.Pki, staging: support.TlsRegistry,
                                                                     tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    build_image(tmp_path / "ctx", project.flavour, (1,))
    client = support.Client(project, tmp_path, pki, "certs.d")
    wrong = "wrong-" + os.urandom(8).hex()
    client.login("credHelpers", staging.host, STAGE_USER, wrong)
    try:
        result = client("push", project.flavour.tag, "--registry", f"{staging.host}/denied", expect=1)
        assert "[registry-auth]" in result.stderr
        assert f"credential helper docker-credential-{support.HELPER_NAME}" in result.stderr
        assert result.stderr.count("error") == 1
        assert wrong not in result.stderr + result.stdout
        assert not project.published.exists()
    finally:
        engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)


def test_an_untrusted_ca_names_the_certs_d_file_that_would_fix_it(pki: support.Pki, staging: support.TlsRegistry,
                                                                   tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    client = support.Client(project, tmp_path, pki, "certs.d")
    empty = tmp_path / "empty-certs.d"
    empty.mkdir()
    client.env["XLA_IMAGES_CERTS_D"] = str(empty)
    result = client("resolve", "--registry", f"{staging.host}/x", expect=1)
    assert "[registry-tls]" in result.stderr and "TLS verification failed" in result.stderr
    assert f"{empty}/{staging.host}/ca.crt" in result.stderr
    assert "ci/registry.sh" not in result.stderr  # no loopback hint for a remote-looking host


def test_a_name_that_does_not_resolve_is_a_dns_error(pki: support.Pki, tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    client = support.Client(project, tmp_path, pki, "certs.d")
    result = client("resolve", "--registry", "no-such-registry.invalid:5443/x", expect=1)
    assert "[registry-dns]" in result.stderr and "ci/registry.sh" not in result.stderr


def test_a_client_certificate_registry_promote_resolve_prune(pki: support.Pki, staging: support.TlsRegistry,
                                                              mtls: support.TlsRegistry, tmp_path: Path) -> None:
    """The toolkit's own client presents certs.d's client.cert/client.key. (The engine cannot be the one to push
    here: dockerd treats a registry whose name resolves into 127.0.0.0/8 as insecure and reads no certs.d for
    it, so it would offer no client certificate; promote copies over the API instead.)"""
    project = make_project(tmp_path / "project")
    build_image(tmp_path / "ctx", project.flavour, (1,))
    client = support.Client(project, tmp_path, pki, "certs.d")
    client.login("auths", staging.host, STAGE_USER, STAGE_PASSWORD)
    client.login("credHelpers", mtls.host, STAGE_USER, STAGE_PASSWORD)
    source, target = f"{staging.host}/to-mtls", f"{mtls.host}/mtls"
    try:
        client("push", project.flavour.tag, "--registry", source)
        digest = json.loads(project.published.read_text())["flavours"][project.flavour.tag]["digest"]
        client("promote", project.flavour.tag, "--from", source, "--to", target)
        assert client("resolve", "--registry", target).stdout.strip() == f"{target}@{digest}"
        client("prune", "--registry", target, "--keep", "0", "--older-than", "1", "--no-gc")
        # Without the client certificate the handshake is refused, and the error says which files to add.
        only_ca = tmp_path / "only-ca"
        (only_ca / mtls.host).mkdir(parents=True)
        shutil.copy(pki.ca, only_ca / mtls.host / "ca.crt")
        client.env["XLA_IMAGES_CERTS_D"] = str(only_ca)
        refused = client("resolve", "--registry", target, expect=1)
        assert "[registry-tls]" in refused.stderr and f"{only_ca}/{mtls.host}/client.cert" in refused.stderr
        assert_no_secret(client, project.root)
    finally:
        engine.images.remove_image(names.local_ref(project.flavour.tag), force=True)


# --- where credentials go: a read redirected to another host ---------------------------------------------------

def put_image(session: requests.Session, base: str, repository: str, tags: tuple[str, ...]) -> str:
    """A config and one layer uploaded as they are, then one manifest under every tag; its digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"io.xla-images.test": "1"}},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    layer = os.urandom(64 << 10)
    descriptors = []
    for data, media_type in ((config, "application/vnd.docker.container.image.v1+json"),
                             (layer, "application/vnd.docker.image.rootfs.diff.tar.gzip")):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        location = session.post(f"{base}/v2/{repository}/blobs/uploads/", timeout=10).headers["Location"]
        location = location if location.startswith("https://") else base + location
        done = session.put(location, params={"digest": digest}, data=data, timeout=10,
                           headers={"Content-Type": "application/octet-stream"})
        assert done.status_code == 201, done.text
        descriptors.append({"mediaType": media_type, "size": len(data), "digest": digest})
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": descriptors[0], "layers": descriptors[1:]}).encode()
    for tag in tags:
        put = session.put(f"{base}/v2/{repository}/manifests/{tag}", data=manifest, timeout=10,
                          headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"})
        assert put.status_code == 201, put.text
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_promote_reads_blobs_redirected_to_another_host_without_sending_it_a_credential(
        pki: support.Pki, staging: support.TlsRegistry, production: support.TlsRegistry, tmp_path: Path) -> None:
    """The real htpasswd registry behind a front that redirects blob reads to a storage host of its own
    (127.0.0.2). While the storage asks for credentials of its own (a Bearer challenge naming a realm on
    127.0.0.3), promote stops with `registry-redirect` and that realm is never asked; once it serves anyone,
    promote to the real token-auth registry completes. The storage host and the realm were sent no
    Authorization and no secret — while the front (the registry the toolkit was told of) got the credentials."""
    project = make_project(tmp_path / "project")
    repository = "redirected"
    reader = stage_session(staging, pki)
    digest = put_image(reader, f"https://{staging.host}", repository, project.flavour.tags)
    storage = support.RecordingStorage(reader, f"https://{staging.host}", repository)
    foreign_realm = support.RecordingStorage(reader, f"https://{staging.host}", repository, address="127.0.0.3")
    front = support.RedirectingFront(staging.host, pki.ca, storage)
    try:
        client = support.Client(project, tmp_path, pki, "certs.d")
        client.login("auths", front.host, STAGE_USER, STAGE_PASSWORD)
        client.login("credHelpers", production.host, PROD_USER, PROD_PASSWORD)
        target = f"{production.host}/from-redirects"
        arguments = ("promote", project.flavour.tag, "--from", f"{front.host}/{repository}", "--to", target)
        storage.challenge_realm = f"{foreign_realm.url}/token"
        refused = client(*arguments, expect=1)
        assert "[registry-redirect]" in refused.stderr and storage.url.removeprefix("http://") in refused.stderr
        assert storage.seen and foreign_realm.seen == []
        storage.challenge_realm = None
        promoted = client(*arguments)
        assert f"{target}@{digest}" in promoted.stdout
        assert len(storage.seen) >= 3  # the refused read, then the config and the layer
        assert storage.authorizations() == [] and foreign_realm.authorizations() == []
        assert storage.leaks(SECRETS) == []
        assert front.authorizations()  # the credentials were in play: the registry itself got them
        assert_no_secret(client, project.root)
    finally:
        front.close()
        storage.close()
        foreign_realm.close()


def test_a_location_that_could_name_two_hosts_is_refused_and_that_host_gets_nothing(
        pki: support.Pki, staging: support.TlsRegistry, production: support.TlsRegistry, tmp_path: Path) -> None:
    """Issue 41 on the real htpasswd + TLS registry: its front answers a blob read's redirect, then an upload's
    Location, with `http://STORAGE\\@FRONT/...` (urlsplit reads the front, the registry's own origin; urllib3
    connects to the storage host before the backslash). Promote from it and promote to it each stop with one
    `[url-ambiguous]` line before any request: the storage host (127.0.0.2) was sent nothing at all, while the
    front got the credentials. The code before this sent the storage host the registry's Basic credentials."""
    project = make_project(tmp_path / "project")
    repository = "ambiguous"
    reader = stage_session(staging, pki)
    put_image(reader, f"https://{staging.host}", repository, project.flavour.tags)
    storage = support.RecordingStorage(reader, f"https://{staging.host}", repository)
    front = support.RedirectingFront(staging.host, pki.ca, storage)
    storage_host = storage.url.removeprefix("http://")
    try:
        client = support.Client(project, tmp_path, pki, "certs.d")
        client.login("auths", front.host, STAGE_USER, STAGE_PASSWORD)
        client.login("auths", staging.host, STAGE_USER, STAGE_PASSWORD)
        client.login("credHelpers", production.host, PROD_USER, PROD_PASSWORD)
        front.blob_location = lambda digest: f"http://{storage_host}\\@{front.host}/v2/{repository}/blobs/{digest}"
        refused = client("promote", project.flavour.tag, "--from", f"{front.host}/{repository}",
                         "--to", f"{production.host}/from-ambiguous", expect=1)
        front.blob_location = None
        front.upload_location = lambda location: (f"http://{storage_host}\\@{front.host}"
                                                  + location.split(staging.host, 1)[-1])
        refused_upload = client("promote", project.flavour.tag, "--from", f"{staging.host}/{repository}",
                                "--to", f"{front.host}/to-ambiguous", expect=1)
        for result in (refused, refused_upload):
            lines = [line for line in result.stderr.splitlines() if "[url-ambiguous]" in line]
            assert len(lines) == 1 and "backslash" in lines[0], result.stderr
        assert storage.seen == []  # no request at all, so no credential
        assert front.authorizations()  # the credentials were in play: the registry itself got them
        assert_no_secret(client, project.root)
    finally:
        front.close()
        storage.close()
