"""Signing's error paths without a registry: keys, passwords, refusal reasons, secrets, the site setting."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from xla_images import settings
from xla_images.errors import ConfigError
from xla_images.model.registry import Registry
from xla_images.model.site import load_site
from xla_images.run.shipping import sign
from xla_images.run.registry import Credentials

PRIVATE = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
PUBLIC = "-----BEGIN PUBLIC KEY-----\nBBBB\n-----END PUBLIC KEY-----\n"
REF = "127.0.0.1:5040/xla-images@sha256:" + "a" * 64


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "cosign.key").write_text(PRIVATE)
    (tmp_path / "cosign.pub").write_text(PUBLIC)
    return tmp_path / "cosign.key", tmp_path / "cosign.pub"


def test_keys_must_exist_and_be_of_the_right_kind(keys: tuple[Path, Path], tmp_path: Path) -> None:
    private, public = keys
    assert sign.Key.parse(str(private), private=True, where="--key").text == str(private.resolve())
    assert sign.Key.parse("env://COSIGN_PUBLIC", private=False, where="--key").text == "env://COSIGN_PUBLIC"
    for text, want_private, words in ((str(public), True, "not a private key"),
                                      (str(private), False, "not a public key"),
                                      (str(tmp_path / "nope.pub"), False, "does not exist")):
        with pytest.raises(ConfigError) as caught:
            sign.Key.parse(text, private=want_private, where="--key")
        assert words in caught.value.message and caught.value.rule == "sign-key"
        assert "AAAA" not in caught.value.render() and "BBBB" not in caught.value.render()


def test_signing_without_cosign_password_is_a_usage_error(keys, monkeypatch) -> None:
    """The password is the key's, given at the CLI's edge: even one in this process's environment is not read
    here (sign reads no environment)."""
    monkeypatch.setenv(sign.PASSWORD_ENV, "in-the-environment")
    with pytest.raises(ConfigError) as caught:
        sign.sign(REF, sign.Key(str(keys[0]), True), None)
    assert caught.value.rule == "sign-password" and caught.value.exit_code == 2


def test_the_key_s_password_reaches_cosign_s_environment_and_is_never_shown(keys) -> None:
    key = sign.Key.parse(str(keys[0]), private=True, where="--key", password="key-pw")
    assert "key-pw" not in repr(key)
    with sign._cosign_env(Registry.parse("127.0.0.1:5040/xla-images"), None, key.password) as env:
        assert env[sign.PASSWORD_ENV] == "key-pw"
    assert settings.read_cosign_password({sign.PASSWORD_ENV: ""}) == ""  # a key made without a password
    assert settings.read_cosign_password({}) is None


def test_only_digest_references_are_signed_or_verified(keys) -> None:
    with pytest.raises(ConfigError) as caught:
        sign.verify("127.0.0.1:5040/xla-images:latest", sign.Key(str(keys[1]), False), None)
    assert caught.value.rule == "sign-by-digest"


def test_verify_needs_a_key_from_the_option_or_the_site() -> None:
    with pytest.raises(ConfigError) as caught:
        sign.verify_ref(REF, None, None)
    assert "cosign_public_key" in caught.value.hint


@pytest.mark.parametrize("stderr, reason", [
    ("Error: no signatures found\n", "it is not signed"),
    ("Error: no matching signatures: invalid signature when validating ASN.1\n", "no signature by this key"),
    ('Error: GET http://x/v2/r/manifests/sha256:0: MANIFEST_UNKNOWN: manifest unknown\n', "no manifest"),
    ("weird\n", "cosign refused it (exit 7)"),
])
def test_refusals_are_explained(stderr: str, reason: str) -> None:
    refused = sign._refusal(subprocess.CompletedProcess([], 7, "", stderr), None)
    assert reason in refused.reason


def test_registry_credentials_reach_cosign_in_a_private_config_never_on_argv(monkeypatch) -> None:
    credentials = Credentials("bot", "s3cret-pw", "environment", from_environment=True)
    registry = Registry.parse("127.0.0.1:5040/xla-images")
    with sign._cosign_env(registry, credentials) as env:
        config = Path(env["DOCKER_CONFIG"]) / "config.json"
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        assert list(json.loads(config.read_text())["auths"]) == ["127.0.0.1:5040"]
    assert not config.exists()
    assert sign._registry_flags(registry) == ["--allow-http-registry=true"]
    assert sign._registry_flags(Registry.parse("registry.example.com/x")) == []
    assert sign._scrub("bad s3cret-pw and key-pw", credentials, "key-pw") == "bad *** and ***"


def test_site_public_key_is_relative_to_the_site_file(tmp_path: Path) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text("cosign_public_key: keys/cosign.pub\n")
    assert load_site(site_file).cosign_public_key() == str(tmp_path / "keys" / "cosign.pub")
    assert load_site(None).cosign_public_key() is None
    assert load_site(None, ("cosign_public_key=env://PUB",)).cosign_public_key() == "env://PUB"
    site_file.write_text("cosign_public_key: [1, 2]\n")
    with pytest.raises(ConfigError) as caught:
        load_site(site_file)
    assert caught.value.rule == "site-cosign-public-key" and "site.yaml:1" in caught.value.render()


def test_cosign_gets_the_engine_trust_of_the_registry(tmp_path: Path, monkeypatch) -> None:
    """The certs.d CA and client certificate the toolkit's own client uses reach cosign as its flags."""
    host = tmp_path / "certs.d" / "registry.example.com:5443"
    host.mkdir(parents=True)
    for name in ("ca.crt", "client.cert", "client.key"):
        (host / name).write_text("x")
    monkeypatch.setenv("XLA_IMAGES_CERTS_D", str(tmp_path / "certs.d"))
    monkeypatch.setenv("XLA_IMAGES_DOCKER_DAEMON_JSON", str(tmp_path / "none.json"))
    assert sign._registry_flags(Registry.parse("registry.example.com:5443/x")) == [
        f"--registry-cacert={host / 'ca.crt'}", f"--registry-client-cert={host / 'client.cert'}",
        f"--registry-client-key={host / 'client.key'}"]
    (tmp_path / "daemon.json").write_text('{"insecure-registries": ["registry.example.com:5443"]}')
    monkeypatch.setenv("XLA_IMAGES_DOCKER_DAEMON_JSON", str(tmp_path / "daemon.json"))
    assert sign._registry_flags(Registry.parse("registry.example.com:5443/x")) == ["--allow-http-registry=true"]
