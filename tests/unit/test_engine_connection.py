"""engine.connection: which engine a command talks to (DOCKER_HOST, DOCKER_CONTEXT, config.json's currentContext,
as the docker CLI decides), the context store read as the CLI writes it, and the error paths (no such context, a
broken context, an engine that does not answer) as one error line with a rule and a hint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import docker.api.client
import pytest

from hostile_inputs import ROOT, run_cli
from xla_images.errors import ConfigError, Failure
from xla_images.run.engine import connection


def write_context(config: Path, name: str, host: str, tls: dict[str, str] | None = None,
                  skip_verify: bool | None = None) -> Path:
    """A context as `docker context create NAME --docker host=...,ca=...,cert=...,key=...` stores it."""
    key = hashlib.sha256(name.encode()).hexdigest()
    endpoint: dict[str, object] = {"Host": host}
    if skip_verify is not None:
        endpoint["SkipTLSVerify"] = skip_verify
    meta = config / "contexts" / "meta" / key
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": name, "Metadata": {}, "Endpoints": {"docker": endpoint}}))
    tls_dir = config / "contexts" / "tls" / key / "docker"
    for file_name, text in (tls or {}).items():
        tls_dir.mkdir(parents=True, exist_ok=True)
        (tls_dir / file_name).write_text(text)
    return tls_dir


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty docker config folder of the test's own, and no engine variables from the outside."""
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    connection.client.cache_clear()
    yield tmp_path
    connection.client.cache_clear()


def test_docker_host_overrides_any_context_as_the_cli_decides(config: Path) -> None:
    (config / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert connection.context_name({"DOCKER_CONFIG": str(config)}) == "remote"
    assert connection.context_name({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "other"}) == "other"
    assert connection.context_name({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "other",
                                    "DOCKER_HOST": "tcp://build-host:2376"}) is None
    assert connection.context_name({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "default"}) is None
    assert connection.context_name({"DOCKER_CONFIG": str(config / "none")}) is None


def test_a_context_is_read_from_the_clis_store_with_its_tls_files(config: Path) -> None:
    tls_dir = write_context(config, "second", "tcp://build-host.internal:2376",
                            {"ca.pem": "ca", "cert.pem": "cert", "key.pem": "key"})
    endpoint = connection.context_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "second"})
    assert endpoint is not None and endpoint.host == "tcp://build-host.internal:2376"
    assert endpoint.tls is not None and endpoint.tls.verify is True
    assert endpoint.tls.ca_cert == str(tls_dir / "ca.pem")
    assert endpoint.tls.cert == (str(tls_dir / "cert.pem"), str(tls_dir / "key.pem"))
    write_context(config, "plain", "unix:///run/other.sock")
    plain = connection.context_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "plain"})
    assert plain is not None and plain.tls is None


@pytest.mark.parametrize("case", ["missing", "corrupt", "no-host", "cert-without-key"])
def test_a_context_that_cannot_be_used_is_named_with_its_rule(config: Path, case: str) -> None:
    environ = {"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "second"}
    if case == "corrupt":
        write_context(config, "second", "tcp://x:1")
        next((config / "contexts" / "meta").glob("*/meta.json")).write_text("{not json")
    elif case == "no-host":
        write_context(config, "second", "")
    elif case == "cert-without-key":
        write_context(config, "second", "tcp://x:1", {"ca.pem": "ca", "cert.pem": "cert"})
    with pytest.raises(ConfigError) as caught:
        connection.context_endpoint(environ)
    assert caught.value.rule == "engine-context" and caught.value.location == "DOCKER_CONTEXT"
    assert "'second'" in caught.value.message and caught.value.hint


def test_a_current_context_from_config_json_is_located_there(config: Path) -> None:
    (config / "config.json").write_text(json.dumps({"currentContext": "gone"}))
    with pytest.raises(ConfigError) as caught:
        connection.context_endpoint({"DOCKER_CONFIG": str(config)})
    assert caught.value.rule == "engine-context" and caught.value.location == str(config / "config.json")


def test_an_engine_a_context_names_that_does_not_answer_is_a_failure_naming_it(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_context(config, "second", "tcp://127.0.0.1:1")  # port 1: refused at once
    monkeypatch.setenv("DOCKER_CONTEXT", "second")
    with pytest.raises(Failure) as caught:
        connection.client()
    assert caught.value.rule == "engine-reachable"
    assert "tcp://127.0.0.1:1 (docker context second)" in caught.value.message
    assert "docker --context second info" in caught.value.hint


def test_the_engines_ca_is_kept_when_requests_ca_bundle_names_another(
        config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Hosts behind a TLS-intercepting proxy set REQUESTS_CA_BUNDLE; requests would let it replace the session's
    # CA on every request, and the engine's certificate would be checked against the proxy's CA.
    tls_dir = write_context(config, "second", "tcp://build-host.internal:2376",
                            {"ca.pem": "ca", "cert.pem": "cert", "key.pem": "key"})
    proxy_ca = tmp_path / "proxy-ca.pem"
    proxy_ca.write_text("proxy")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(proxy_ca))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(proxy_ca))
    monkeypatch.setattr(docker.api.client.APIClient, "_retrieve_server_version", lambda self: "1.45")
    endpoint = connection.context_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "second"})
    assert endpoint is not None
    engine = connection._connect(endpoint.host, endpoint.tls)  # noqa: SLF001
    merged = engine.api.merge_environment_settings("https://build-host.internal:2376/_ping", {}, False, None, None)
    assert merged["verify"] == str(tls_dir / "ca.pem")
    assert engine.api.cert == (str(tls_dir / "cert.pem"), str(tls_dir / "key.pem"))


def test_a_command_given_a_context_that_does_not_exist_answers_one_error_line(config: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONTEXT", "no-such-engine")
    # `test`, not `build`: a build first waits for its flavour's lock, which another checkout's build may hold.
    outcome = run_cli("test", "r2.9.0_3.11_cpu", "--matrix", str(ROOT / "matrix.yaml"))
    assert outcome.code == 2, outcome.err
    assert outcome.rules == ["engine-context"], outcome.err
    assert "Traceback" not in outcome.err and "no-such-engine" in outcome.err
