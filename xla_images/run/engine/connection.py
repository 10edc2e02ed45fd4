"""The connection to the Docker engine, chosen by the docker CLI's conventions, and how its errors read.

Which engine, as `docker` itself decides (so the toolkit, its buildx subprocesses and a user's `docker` commands
reach the same one): DOCKER_HOST when set (with DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as `docker.from_env`
reads them); else the context DOCKER_CONTEXT names, else the `currentContext` of $DOCKER_CONFIG/config.json;
else the local socket. The SDK reads no contexts, so a context's endpoint and TLS files are read here from the
CLI's context store ($DOCKER_CONFIG/contexts, ~/.docker/contexts). `client()` fails early with a hint when no
engine answers; every other engine module goes through it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import docker
import docker.constants
import docker.errors
import docker.tls
import docker.utils

from ...errors import ConfigError, Failure, shorten


START_HINT = "start one with `ci/engine.sh start` (installs and runs dockerd), then check with `build.py doctor`"
CONTEXT_HINT = ("`docker context ls` lists the contexts (`ci/second-engine.sh start` creates xla-images-second); "
                "unset DOCKER_CONTEXT for the default engine")
LineSink = Callable[[str], None]
# How long the first answer may take: an engine across a network that drops packets must not hold a command
# for the ten minutes a build request may take.
CONNECT_TIMEOUT = 30
REQUEST_TIMEOUT = 600


@dataclass(frozen=True)
class Endpoint:
    """An engine address from a docker context: `host` (tcp://, unix://, ssh://) and its TLS files (or none)."""

    context: str
    host: str
    tls: docker.tls.TLSConfig | None


@functools.lru_cache(maxsize=1)
def client() -> docker.DockerClient:
    """A client for the engine the docker CLI would talk to here (the module's docstring says which).

    The API version is negotiated: the SDK may be newer than the engine (dockerd 20.10 speaks 1.41).
    """
    endpoint = context_endpoint(os.environ)
    where = f" at {endpoint.host} (docker context {endpoint.context})" if endpoint else ""
    hint = START_HINT if endpoint is None else (
        f"is that engine up? `docker --context {endpoint.context} info` asks it the same way"
        + ("; `ci/second-engine.sh start` starts it" if endpoint.context == "xla-images-second" else ""))
    try:
        if endpoint is None:
            settings = docker.utils.kwargs_from_env(environment=os.environ)  # DOCKER_HOST, DOCKER_TLS_VERIFY...
            engine = _connect(settings.get("base_url"), settings.get("tls") or False)
        else:
            engine = _connect(endpoint.host, endpoint.tls or False)
    except ValueError as error:  # the SDK parses the address with urllib: a bad port, an unclosed [ ...
        raise _bad_host(endpoint, error) from None
    except docker.errors.TLSParameterError as error:  # DOCKER_CERT_PATH without its files
        raise ConfigError(f"the engine's TLS files cannot be used: {error}", location="DOCKER_CERT_PATH",
                          rule="engine-host",
                          hint="DOCKER_CERT_PATH names a folder with ca.pem, cert.pem and key.pem; unset "
                               "DOCKER_TLS_VERIFY for an engine without TLS") from None
    except (docker.errors.DockerException, OSError) as error:
        raise Failure(f"no Docker engine answers{where}: {error_text(error)}", rule="engine-reachable",
                      hint=hint) from None
    try:
        engine.ping()
    except (docker.errors.DockerException, OSError, ValueError) as error:
        raise Failure(f"no Docker engine answers{where}: {error_text(error)}", rule="engine-reachable",
                      hint=hint) from None
    engine.api.timeout = REQUEST_TIMEOUT  # it answered: now builds and pulls may take their time
    return engine


def _connect(base_url: str | None, tls: docker.tls.TLSConfig | bool) -> docker.DockerClient:
    """A client, its API version negotiated after the engine's CA is made to stick.

    requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (set on hosts behind a TLS-intercepting proxy, as here)
    replace a session's own CA on every request: the engine's certificate would then be checked against the
    proxy's CA and refused. So the client is made with a fixed version (no request yet), told to keep its CA,
    and only then asks the engine which version it speaks, as `version="auto"` would.
    """
    engine = docker.DockerClient(base_url=base_url, tls=tls, version=docker.constants.MINIMUM_DOCKER_API_VERSION,
                                 timeout=CONNECT_TIMEOUT)
    session = engine.api
    if tls:
        merge = session.merge_environment_settings

        def keep_engine_ca(url, proxies, stream, verify, cert):  # type: ignore[no-untyped-def]
            merged = merge(url, proxies, stream, verify, cert)
            merged["verify"] = session.verify
            return merged

        session.merge_environment_settings = keep_engine_ca  # type: ignore[method-assign]
    session._version = session._retrieve_server_version()  # noqa: SLF001 (what version="auto" calls)
    return engine


def _bad_host(endpoint: Endpoint | None, error: ValueError) -> ConfigError:
    if endpoint is not None:
        return ConfigError(f"docker context {endpoint.context!r}: {shorten(endpoint.host)!r} is not an engine "
                           f"address: {error}", location="DOCKER_CONTEXT", rule="engine-context",
                           hint=f"fix it with `docker context update {endpoint.context} --docker host=...`")
    return ConfigError(f"DOCKER_HOST={shorten(os.environ.get('DOCKER_HOST', ''))!r} is not an engine "
                       f"address: {error}", location="DOCKER_HOST", rule="engine-host",
                       hint="unix:///var/run/docker.sock, tcp://HOST:PORT (port 1-65535) or ssh://USER@HOST; "
                            "unset it for the local socket")


def context_name(environ: Mapping[str, str]) -> str | None:
    """The docker context the CLI would use, or None for DOCKER_HOST / the default engine (docker/cli's order:
    DOCKER_HOST overrides any context, then DOCKER_CONTEXT, then config.json's currentContext)."""
    if environ.get("DOCKER_HOST"):
        return None
    name = environ.get("DOCKER_CONTEXT") or _current_context(docker_config_dir(environ))
    return None if not name or name == "default" else name


def docker_config_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def _current_context(config_dir: Path) -> str | None:
    try:
        document = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {config_dir / 'config.json'}: {error}", location=str(config_dir),
                          rule="engine-context", hint="fix or remove the file (it is the docker CLI's)") from None
    current = document.get("currentContext") if isinstance(document, dict) else None
    return current if isinstance(current, str) else None


def context_endpoint(environ: Mapping[str, str]) -> Endpoint | None:
    """The engine endpoint of the context in use (None: DOCKER_HOST or the default engine); a context that does
    not exist or cannot be read is a ConfigError (rule engine-context)."""
    name = context_name(environ)
    if name is None:
        return None
    store = docker_config_dir(environ) / "contexts"
    key = hashlib.sha256(name.encode("utf-8")).hexdigest()  # the CLI's store names a context by its hash
    meta_file = store / "meta" / key / "meta.json"

    def bad(message: str) -> ConfigError:
        return ConfigError(f"docker context {shorten(name, 80)!r}: {message}", location="DOCKER_CONTEXT"
                           if environ.get("DOCKER_CONTEXT") else str(docker_config_dir(environ) / "config.json"),
                           rule="engine-context", hint=CONTEXT_HINT)

    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad(f"no such context (looked for {meta_file})") from None
    except (OSError, ValueError) as error:
        raise bad(f"cannot read {meta_file}: {error}") from None
    endpoint = (meta.get("Endpoints") or {}).get("docker") if isinstance(meta, dict) else None
    if not isinstance(endpoint, dict) or not isinstance(endpoint.get("Host"), str) or not endpoint["Host"]:
        raise bad(f"{meta_file} names no docker endpoint host")
    return Endpoint(name, endpoint["Host"], _context_tls(store / "tls" / key / "docker",
                                                          bool(endpoint.get("SkipTLSVerify", False)), bad))


def _context_tls(directory: Path, skip_verify: bool, bad: Callable[[str], ConfigError]) -> docker.tls.TLSConfig | None:
    """The context's TLS files (ca.pem, cert.pem, key.pem, as `docker context create --docker ca=,cert=,key=`
    stores them); None when it has none (a unix socket, or plain tcp)."""
    if not directory.is_dir():
        return None
    files = {name: directory / f"{name}.pem" for name in ("ca", "cert", "key")}
    present = {name for name, path in files.items() if path.is_file()}
    if not present:
        return None
    if ("cert" in present) != ("key" in present):
        raise bad(f"{directory} holds a client certificate without its key (or the reverse)")
    try:
        return docker.tls.TLSConfig(
            client_cert=(str(files["cert"]), str(files["key"])) if "cert" in present else None,
            ca_cert=str(files["ca"]) if "ca" in present else None, verify=not skip_verify)
    except docker.errors.TLSParameterError as error:
        raise bad(f"its TLS files cannot be used: {error}") from None


def api() -> docker.APIClient:
    """The low-level client of `client()` (streaming builds, archives)."""
    return client().api


def engine_version() -> str:
    """`20.10.24+dfsg1 (API 1.41)`."""
    info = client().version()
    return f"{info.get('Version', '?')} (API {info.get('ApiVersion', '?')})"


def error_text(error: Exception) -> str:
    """What an SDK or HTTP error says, without its wrapping (the engine's own explanation when it gave one)."""
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


def engine_info() -> dict:
    """`docker info`: DockerRootDir, Driver, CgroupDriver, ServerVersion..."""
    return client().info()


CONTAINERD_SNAPSHOTTER = "io.containerd.snapshotter.v1"  # `docker info`'s driver-type under the containerd store


@functools.lru_cache(maxsize=1)
def image_store() -> str:
    """`containerd` when the engine keeps images in containerd's content store (dockerd's containerd-snapshotter
    feature), else `classic` (a graph driver such as overlay2).

    It decides what a build exports and who pushes: the containerd store keeps each layer as compressed blobs
    (BuildKit writes them in the site's compression, the engine pushes them as they are) and names an image by
    its manifest digest; the classic store keeps layers uncompressed, names an image by its config digest and
    pushes gzip only. Asked once per process: an engine changes store only when restarted.
    """
    status = engine_info().get("DriverStatus") or []
    kinds = {str(pair[1]) for pair in status if isinstance(pair, (list, tuple)) and len(pair) == 2
             and pair[0] == "driver-type"}
    return "containerd" if CONTAINERD_SNAPSHOTTER in kinds else "classic"
