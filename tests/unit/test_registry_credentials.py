"""run.registry.credentials: docker's order (environment, credHelpers, credsStore, auths), real helper
programs speaking the credential-helper protocol (scripts in a temp dir on PATH), and a docker config read
bounded and checked. Secrets never appear in an error."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from xla_images.errors import ConfigError, Failure
from xla_images.run.registry import credentials as creds

SECRET = "s3cr3t-" + "x" * 8
HOST = "reg.example.com:5443"


def helper(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / f"docker-credential-{name}"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def config(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    return path


def env_for(tmp_path: Path) -> dict[str, str]:
    return {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def answer(user: str, secret: str) -> str:
    return f"read host\necho '{json.dumps({'ServerURL': HOST, 'Username': user, 'Secret': secret})}'\n"


def test_docker_order_env_then_credhelpers_then_credsstore_then_auths(tmp_path: Path) -> None:
    helper(tmp_path / "bin", "per-host", answer("from-helper", SECRET))
    helper(tmp_path / "bin", "store", answer("from-store", SECRET))
    pair = base64.b64encode(f"from-auths:{SECRET}".encode()).decode()
    full = {"credHelpers": {HOST: "per-host"}, "credsStore": "store", "auths": {HOST: {"auth": pair}}}
    env = env_for(tmp_path)
    found = creds.load_credentials(HOST, {**env, creds.USER_ENV: "ci", creds.PASSWORD_ENV: SECRET},
                                   config(tmp_path, full), named=(HOST,))
    assert found is not None and found.username == "ci" and found.from_environment
    found = creds.load_credentials(HOST, env, config(tmp_path, full))
    assert found is not None and found.username == "from-helper" and "docker-credential-per-host" in found.source
    del full["credHelpers"]
    found = creds.load_credentials(HOST, env, config(tmp_path, full))
    assert found is not None and found.username == "from-store" and "credsStore" in found.source
    del full["credsStore"]
    found = creds.load_credentials(HOST, env, config(tmp_path, full))
    assert found is not None and found.username == "from-auths" and "`auths`" in found.source
    assert found.password == SECRET and not found.from_environment


def test_a_helper_without_the_host_falls_through_to_auths(tmp_path: Path) -> None:
    helper(tmp_path / "bin", "store", "echo 'credentials not found in native keychain'\nexit 1\n")
    pair = base64.b64encode(f"u:{SECRET}".encode()).decode()
    found = creds.load_credentials(HOST, env_for(tmp_path),
                                   config(tmp_path, {"credsStore": "store", "auths": {HOST: {"auth": pair}}}))
    assert found is not None and found.username == "u"


def test_identity_token_from_a_helper_and_tokens_from_auths(tmp_path: Path) -> None:
    helper(tmp_path / "bin", "gcloud", answer("<token>", SECRET))
    found = creds.load_credentials(HOST, env_for(tmp_path), config(tmp_path, {"credHelpers": {HOST: "gcloud"}}))
    assert found is not None and found.identity_token == SECRET and found.basic is None
    assert found.auth_config(HOST) == {"identitytoken": SECRET, "serveraddress": HOST}
    found = creds.load_credentials(HOST, {}, config(tmp_path, {"auths": {HOST: {"registrytoken": SECRET}}}))
    assert found is not None and found.auth_config(HOST)["registrytoken"] == SECRET
    assert SECRET not in repr(found) and creds.redact(f"x {SECRET} y", found) == "x *** y"


@pytest.mark.parametrize("body, rule, said", [
    ("echo 'keyring locked' >&2\nexit 3\n", "registry-credentials", "exit 3: keyring locked"),
    ("echo 'not json'\n", "registry-answer", "is not"),
    ("echo '[1, 2]'\n", "registry-answer", "is not"),
    ("echo '{\"Username\": 1, \"Secret\": \"x\"}'\n", "registry-answer", "is not"),
    ("yes xxxxxxxxxxxxxxxx\n", "registry-answer", "more than"),
])
def test_a_failing_or_garbled_helper_is_a_clear_error(tmp_path: Path, body: str, rule: str, said: str) -> None:
    helper(tmp_path / "bin", "bad", body)
    with pytest.raises(Failure) as caught:
        creds.load_credentials(HOST, env_for(tmp_path), config(tmp_path, {"credsStore": "bad"}))
    assert caught.value.rule == rule and said in caught.value.message
    assert "docker-credential-bad" in caught.value.render()


def test_a_hanging_helper_is_killed_after_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    helper(tmp_path / "bin", "slow", "sleep 30\n")
    monkeypatch.setattr(creds, "HELPER_TIMEOUT", 0.5)
    with pytest.raises(Failure, match="did not answer within"):
        creds.load_credentials(HOST, env_for(tmp_path), config(tmp_path, {"credsStore": "slow"}))


def test_a_missing_helper_names_itself_and_the_config_entry(tmp_path: Path) -> None:
    path = config(tmp_path, {"credHelpers": {HOST: "nowhere"}})
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials(HOST, {"PATH": str(tmp_path)}, path)
    assert caught.value.rule == "registry-credentials"
    assert "docker-credential-nowhere is not on PATH" in caught.value.message and str(path) in caught.value.render()


@pytest.mark.parametrize("document, problem", [
    ({"auths": [HOST]}, "`auths` is a list"),
    ({"auths": {HOST: {"auth": 12}}}, ".auth` is a int"),
    ({"auths": {HOST: "x"}}, "is a str, not an object"),
    ({"credsStore": "../../bin/sh"}, "`credsStore` is not a helper name"),
    ({"credHelpers": {HOST: ["gcloud"]}}, "`credHelpers` is not an object"),
    ([1], "top level is a list"),
])
def test_a_malformed_docker_config_is_a_config_error_with_a_rule(tmp_path: Path, document: object,
                                                                 problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials(HOST, {}, config(tmp_path, document))
    assert caught.value.rule == "docker-config" and problem in caught.value.message


def test_a_huge_docker_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as handle:
        handle.truncate(3 << 30)  # 3 GiB, sparse
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials(HOST, {}, path)
    assert caught.value.rule == "file-size"


def test_a_secret_in_a_malformed_auth_is_never_echoed(tmp_path: Path) -> None:
    bad = base64.b64encode(SECRET.encode()).decode()
    with pytest.raises(ConfigError) as caught:
        creds.load_credentials(HOST, {}, config(tmp_path, {"auths": {HOST: {"auth": bad}}}))
    assert SECRET not in caught.value.render() and bad not in caught.value.render()
