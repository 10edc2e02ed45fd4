"""Which scheme and which certificates to use for a registry host: what the engine itself would trust.

The engine (dockerd) trusts the system store plus, per registry, `/etc/docker/certs.d/HOST[:PORT]/`:
every `*.crt` there is a CA, every `*.cert` with its `*.key` a client certificate (mTLS). It speaks plain
http to loopback registries and to those its daemon.json lists under `insecure-registries`. This module
reads the same places, so a registry `docker push` reaches is one the toolkit's own HTTP client reaches:

* the system store, as OpenSSL finds it (SSL_CERT_FILE / SSL_CERT_DIR when set), and the bundle
  REQUESTS_CA_BUNDLE names;
* `$XLA_IMAGES_CERTS_D/HOST[:PORT]/` (default /etc/docker/certs.d): CAs and client certificates;
* `$XLA_IMAGES_DOCKER_DAEMON_JSON` (default /etc/docker/daemon.json): `insecure-registries`.

Every file goes through the bounded reader; a malformed one is a ConfigError naming it.
"""
from __future__ import annotations

import ipaddress
import json
import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ... import userfiles
from ...errors import ConfigError, Location
from .errors import CERTS_D_DEFAULT, is_loopback

CERTS_D_ENV = "XLA_IMAGES_CERTS_D"
DAEMON_JSON_ENV = "XLA_IMAGES_DOCKER_DAEMON_JSON"
DAEMON_JSON_DEFAULT = "/etc/docker/daemon.json"
CERT_LIMIT = 1 * userfiles.MIB
DAEMON_JSON_LIMIT = 1 * userfiles.MIB
MAX_CERT_FILES = 64


@dataclass(frozen=True)
class Trust:
    """How to reach one registry host: the scheme, and for https the CAs and client certificate to use."""

    host: str
    scheme: str
    certs_dir: Path
    ca_files: tuple[Path, ...] = ()
    client_cert: tuple[Path, Path] | None = None
    env_bundle: str | None = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    def describe(self) -> str:
        """Which CAs were tried, for an error message."""
        store = os.environ.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().openssl_cafile
        parts = [f"the system store ({store})"]
        if self.env_bundle:
            parts.append(f"REQUESTS_CA_BUNDLE ({self.env_bundle})")
        parts += [str(path) for path in self.ca_files]
        if not self.ca_files:
            parts.append(f"no CA in {self.certs_dir / self.host}")
        return ", ".join(parts)

    def ssl_context(self) -> ssl.SSLContext:
        """The system store, the environment's bundle, the certs.d CAs and client certificate, verified."""
        _check_system_store()
        context = ssl.create_default_context()
        if self.env_bundle:
            _load_cas(context, Path(self.env_bundle), "REQUESTS_CA_BUNDLE")
        for path in self.ca_files:
            _load_cas(context, path, str(path))
        if self.client_cert is not None:
            cert, key = self.client_cert
            for path in (cert, key):
                userfiles.read_text(path, limit=CERT_LIMIT)  # a regular, bounded, text file before ssl opens it
            try:
                context.load_cert_chain(str(cert), str(key))
            except (ssl.SSLError, OSError) as error:
                raise ConfigError(f"not a client certificate and its key: {error}", location=Location(str(cert)),
                                  rule="registry-tls", hint=f"PEM files, as `docker` reads them: {cert.name} "
                                                            f"and {key.name}") from None
        return context


def _check_system_store() -> None:
    """OpenSSL opens SSL_CERT_FILE as it is: a fifo there would block the command forever, a directory fails
    obscurely. What it names must be a regular file (a missing one OpenSSL skips, as it always did)."""
    path = os.environ.get("SSL_CERT_FILE")
    if not path:
        return
    try:
        mode = os.stat(path).st_mode  # stat does not open: a fifo does not block here
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kind = "directory" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode) else "special file"
        raise ConfigError(f"SSL_CERT_FILE names a {kind}, not a CA bundle", location=Location(path),
                          rule="registry-tls", hint="point SSL_CERT_FILE at a PEM bundle, or unset it for the "
                                                    "system store")


def _load_cas(context: ssl.SSLContext, path: Path, where: str) -> None:
    text = userfiles.read_text(path, limit=CERT_LIMIT)
    try:
        context.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as error:
        raise ConfigError(f"not a PEM CA certificate bundle ({error})", location=Location(where),
                          rule="registry-tls", hint="a CA file holds `-----BEGIN CERTIFICATE-----` blocks") from None


def load_trust(host: str, environ: Mapping[str, str] | None = None) -> Trust:
    environ = os.environ if environ is None else environ
    certs_dir = Path(environ.get(CERTS_D_ENV) or CERTS_D_DEFAULT)
    insecure = is_loopback(host) or host_is_insecure(host, _insecure_registries(environ))
    bundle = environ.get("REQUESTS_CA_BUNDLE") or None
    if insecure:
        return Trust(host, "http", certs_dir)
    ca_files, client = _certs_d(certs_dir / host)
    return Trust(host, "https", certs_dir, ca_files, client, bundle)


def _certs_d(directory: Path) -> tuple[tuple[Path, ...], tuple[Path, Path] | None]:
    """The CA files and the client certificate pair in one certs.d directory, as dockerd pairs them."""
    if not directory.is_dir():
        return (), None
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)[:MAX_CERT_FILES * 3]
    except OSError as error:
        raise ConfigError(f"cannot list the directory: {error.strerror}", location=Location(str(directory)),
                          rule="registry-tls") from None
    names = {entry.name for entry in entries}
    cas = tuple(directory / name for name in sorted(names) if name.endswith(".crt"))[:MAX_CERT_FILES]
    certs = sorted(name for name in names if name.endswith(".cert"))
    client = None
    for name in certs:
        key = name[:-len(".cert")] + ".key"
        if key not in names:
            raise ConfigError(f"client certificate {name} has no {key} beside it", location=Location(str(directory)),
                              rule="registry-tls", hint="dockerd refuses this directory too: add the key or remove "
                                                        "the certificate")
        client = client or (directory / name, directory / key)
    return cas, client


def _insecure_registries(environ: Mapping[str, str]) -> list[str]:
    path = Path(environ.get(DAEMON_JSON_ENV) or DAEMON_JSON_DEFAULT)
    if not os.path.lexists(path):
        return []
    text = userfiles.read_text(path, limit=DAEMON_JSON_LIMIT)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"not JSON: {str(error)[:80]}", location=Location(str(path)), rule="daemon-json",
                          hint="the engine refuses it too; fix the file") from None
    entries = document.get("insecure-registries", []) if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ConfigError("`insecure-registries` is not a list of strings", location=Location(str(path)),
                          rule="daemon-json", hint='for example "insecure-registries": ["registry.lan:5000"]')
    return entries


def host_is_insecure(host: str, entries: list[str]) -> bool:
    """Whether `host` is listed by name (`HOST[:PORT]`) or falls in a listed CIDR, as dockerd matches them."""
    if host in entries:
        return True
    name = host[1:host.index("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    for entry in entries:
        if "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
    return False
