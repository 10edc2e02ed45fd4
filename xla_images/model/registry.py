"""Where images go: `HOST[:PORT]/REPOSITORY`, the one grammar for site.yaml's `registry` and every --registry,
--from and --to option; and where they may be pulled from instead: a pull mirror `HOST[:PORT][/PREFIX]` (site
`pull_mirror`, --mirror). Pure: naming a registry asks nothing of it (run.shipping.publish does the talking)."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..errors import ConfigError, Location, shown_value

EXAMPLE = "127.0.0.1:5000/xla-images"
_REPOSITORY_PART = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
# Docker's reference grammar (distribution/reference): a domain is dot-separated components of letters, digits
# and inner hyphens (no empty component, so no `..`; no leading or trailing `-`), or a bracketed IPv6 address;
# then an optional port. The port must also be one a socket can use: 1-65535.
_COMPONENT = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"^(?P<name>\[[0-9a-fA-F:.]+\]|{_COMPONENT}(?:\.{_COMPONENT})*)(?::(?P<port>[0-9]{{1,5}}))?$",
                   re.ASCII)
MAX_PORT = 65535
# RFC 1123 host names, as resolvers take them: labels of 1-63 letters, digits and inner hyphens, 253 in all.
MAX_LABEL, MAX_HOST_NAME = 63, 253
SHAPE = "expected HOST[:PORT]/REPOSITORY"
# An image reference as Docker reads it (distribution's reference grammar, reference/regexp.go): an optional
# domain (components as above, or [IPv6], then :PORT) and `/`, lowercase path components joined by `/` (inner
# `.`, `_`, `__` or runs of `-`), then `:TAG` ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}) and/or `@ALGORITHM:HEX`.
# Site `bases` must be one: the value lands in a Dockerfile FROM line (`python:3.11;curl${IFS}...|sh` is not
# one). The JSON Schema of site.yaml is generated from this pattern.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"  # _COMPONENT of RFC 1123's length, for one regex
_DOMAIN = rf"(?:\[[0-9a-fA-F:.]+\]|{_LABEL}(?:\.{_LABEL})*)(?::[0-9]{{1,5}})?"
IMAGE_REFERENCE = re.compile(
    rf"(?=.{{1,512}}$)(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII)


def host_problem(host: str) -> str | None:
    """Why `host` (`NAME[:PORT]`) is not a registry host as Docker reads it, or None."""
    match = _HOST.fullmatch(host)
    if match is None:
        return (f"{shown_value(host)} is not a registry host (letters, digits, inner hyphens and single dots, or "
                "[IPv6], then :PORT)")
    if match["port"] is not None and not 1 <= int(match["port"]) <= MAX_PORT:
        return f"port {match['port']} is not between 1 and {MAX_PORT}"
    name = match["name"]
    if name.startswith("["):
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return f"{shown_value(name)} is not an IPv6 address"
    elif len(name) > MAX_HOST_NAME or any(len(label) > MAX_LABEL for label in name.split(".")):
        return (f"the host name {shown_value(name)} ({len(name)} characters) is not one a resolver takes "
                f"(RFC 1123: labels of at most {MAX_LABEL} characters, {MAX_HOST_NAME} in all)")
    if "." not in host and ":" not in host and host != "localhost":
        # Docker reads a first part without a dot or port as a Docker Hub namespace, not a registry.
        return f"{shown_value(host)} is not a registry host (it needs a dot, a port or to be localhost)"
    return None



def _repository_problem(repository: str) -> str | None:
    if not all(_REPOSITORY_PART.match(part) for part in repository.split("/")):
        return f"{repository!r} is not a repository name (lowercase letters, digits, . _ - and /)"
    return None


def registry_problem(text: str) -> str | None:
    """Why `text` does not name a registry repository as Docker reads it, or None when it does."""
    host, sep, repository = text.strip().partition("/")
    if not sep or not host or not repository:
        return SHAPE
    problem = host_problem(host)
    if problem is not None:
        return problem
    return _repository_problem(repository)


MIRROR_EXAMPLE = "mirror.zone.internal:5000"
MIRROR_SHAPE = "expected HOST[:PORT] or HOST[:PORT]/PREFIX (no scheme)"


def mirror_problem(text: str) -> str | None:
    """Why `text` is not a pull mirror `HOST[:PORT][/PREFIX]` as Docker reads a registry host, or None."""
    stripped = text.strip()
    if not stripped or "://" in stripped or stripped.endswith("/"):
        return MIRROR_SHAPE
    host, sep, prefix = stripped.partition("/")
    problem = host_problem(host)
    if problem is not None or not sep:
        return problem
    return _repository_problem(prefix)


@dataclass(frozen=True)
class Registry:
    """`HOST[:PORT]/REPOSITORY`, the form site.registry and --registry take."""

    host: str
    repository: str

    @classmethod
    def parse(cls, text: str, where: str = "--registry") -> Registry:
        problem = registry_problem(text)
        if problem is not None:
            raise ConfigError(f"bad registry {text!r}: {problem}", location=Location(where),
                              rule="registry-format", hint=f"for example {EXAMPLE}")
        host, _, repository = text.strip().partition("/")
        return cls(host, repository)

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    def ref(self, tag: str) -> str:
        return f"{self.name}:{tag}"

    def digest_ref(self, digest: str) -> str:
        return f"{self.name}@{digest}"

    @property
    def base_url(self) -> str:
        # Docker itself speaks plain http to loopback registries and https to every other one.
        return f"{'http' if is_loopback(self.host) else 'https'}://{self.host}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Mirror:
    """A pull-through cache of origin registries: `HOST[:PORT][/PREFIX]`. It serves an origin repository under
    the same name (after PREFIX, for caches that keep each origin under a path of their own), and anything it
    serves by digest is what the origin serves by that digest: the engine checks the bytes against it."""

    host: str
    prefix: str = ""

    @classmethod
    def parse(cls, text: str, where: str = "--mirror") -> Mirror:
        problem = mirror_problem(text)
        if problem is not None:
            raise ConfigError(f"bad pull mirror {text!r}: {problem}", location=Location(where),
                              rule="mirror-format", hint=f"for example {MIRROR_EXAMPLE} or {MIRROR_EXAMPLE}/cache")
        host, _, prefix = text.strip().partition("/")
        return cls(host, prefix)

    @property
    def name(self) -> str:
        return f"{self.host}/{self.prefix}" if self.prefix else self.host

    def registry_for(self, origin: Registry) -> Registry:
        """The mirror's repository that caches `origin`'s."""
        repository = f"{self.prefix}/{origin.repository}" if self.prefix else origin.repository
        return Registry(self.host, repository)

    def __str__(self) -> str:
        return self.name


def is_loopback(host: str) -> bool:
    """`127.0.0.1:5000`, `localhost`, `[::1]:5000` (any 127.x too): where the engine speaks plain http without
    configuration. The one place this is decided: base_url, the registry client's TLS and hints, prune."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:host.index("]")]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# What a registry may answer for a tag or digest: single-platform manifests and indexes, Docker and OCI; the
# engine's own store holds the same documents. distribution refuses manifests over 4 MiB.
MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json", "application/vnd.oci.image.manifest.v1+json")
INDEX_TYPES = ("application/vnd.docker.distribution.manifest.list.v2+json", "application/vnd.oci.image.index.v1+json")
MANIFEST_LIMIT = 4 << 20
