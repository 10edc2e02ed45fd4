"""Where a registry credential may go: the one policy every request of run.registry follows, as docker's.

The rules, and the upstream behaviour each follows (docs/reliability.md, "Where credentials go"):

1. A credential belongs to one registry host (`HOST[:PORT]`, how the docker config keys it) and its
   Authorization header goes only to that registry's origin (scheme, host, port): distribution's client adds
   it in `endpointAuthorizer.ModifyRequest` (registry/client/auth/session.go) only to a request whose
   `scheme://host:port/v2/` it holds a challenge for, i.e. the registry it pinged.
2. The token realm named by the registry's OWN 401 challenge gets the basic credentials or the identity token,
   on whatever host it is: distribution's token handler asks `creds.Basic(realmURL)` and moby's
   `staticCredentialStore.Basic` ignores the URL (registry/auth.go), so docker sends them there too. A
   challenge from any other host (a redirect target, an upload Location) is never answered.
3. Redirects are followed here, not by requests: a hop that leaves the registry's origin carries no
   Authorization for the rest of the chain (Go's http.Client drops it when the host changes:
   net/http client.go `shouldCopyHeaderOnRedirect`; we do not keep it for subdomains either), and only GET and
   HEAD are followed (a PUT, PATCH, POST or DELETE that is redirected is the caller's error, never a body
   resent elsewhere). At most MAX_REDIRECTS hops (Go's `defaultCheckRedirect`).
4. XLA_IMAGES_REGISTRY_USER/_PASSWORD belong to the host XLA_IMAGES_REGISTRY names, or, when it is unset,
   to the registries the command names itself (--registry, --from, --to, the site's `registry`): never to a
   host that only a file (published.json) names.
"""
from __future__ import annotations

from typing import Iterable, Mapping
from urllib.parse import urljoin, urlsplit

from ...errors import ConfigError, Failure, Location
from ...model.registry import host_problem

ENVIRONMENT_REGISTRY = "XLA_IMAGES_REGISTRY"
MAX_REDIRECTS = 10
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
FOLLOWED_METHODS = ("GET", "HEAD")
_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]


def origin(url: str) -> Origin:
    """(scheme, host, port) of an absolute URL, the port made explicit: what "the same host" compares."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # `http://[::1` or `https://[zz]/x`: a Location that a registry must never answer
        raise not_a_url() from None
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: an origin no registry has
        port = -1
    return scheme, (hostname or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme, -1)


def not_a_url() -> Failure:
    # The URL itself is not shown: it may hold a user:password part, and it is not one a person can use.
    return Failure("a registry answered a Location that is not a valid URL", rule="registry-answer",
                   hint="check the registry (or the proxy before it)")


def path_of(url: str) -> str:
    """The path of a URL (an upload Location), for messages; a Failure when it is not a valid URL."""
    try:
        return urlsplit(url).path
    except ValueError:
        raise not_a_url() from None


def same_origin(url: str, other: str) -> bool:
    return origin(url) == origin(other)


def host_of(url: str) -> str:
    """`HOST[:PORT]` of a URL as a message shows it (never a user:password part)."""
    try:
        return urlsplit(url).netloc.rpartition("@")[2]
    except ValueError:
        return "(a URL that is not valid)"


def environment_hosts(environ: Mapping[str, str], named: Iterable[str]) -> frozenset[str]:
    """The registry hosts XLA_IMAGES_REGISTRY_USER/_PASSWORD may go to (rule 4 of the module docstring)."""
    text = environ.get(ENVIRONMENT_REGISTRY, "").strip()
    if not text:
        return frozenset(named)
    host = text.partition("/")[0]
    problem = host_problem(host)
    if problem is not None:
        raise ConfigError(f"{ENVIRONMENT_REGISTRY} does not name a registry: {problem}",
                          location=Location(ENVIRONMENT_REGISTRY), rule="registry-format",
                          hint="HOST[:PORT] or HOST[:PORT]/REPOSITORY, the registry the environment's credentials "
                               "are for")
    return frozenset({host})


def redirect_target(current: str, location: str | None, method: str, hops: int) -> str | None:
    """The absolute URL a redirect answer sends a request to, or None when it is not to be followed."""
    if method not in FOLLOWED_METHODS or not location:
        return None
    if hops >= MAX_REDIRECTS:
        raise Failure(f"{host_of(current)} redirected {method} more than {MAX_REDIRECTS} times",
                      rule="registry-redirect", hint="the registry or its storage redirects in a loop")
    try:
        target = urljoin(current, location)
    except ValueError:
        raise not_a_url() from None
    if origin(target)[0] not in _DEFAULT_PORTS:
        raise Failure(f"{host_of(current)} redirected {method} to a URL that is not http(s)",
                      rule="registry-redirect", hint="a registry redirects blob reads to http(s) storage only")
    return target


def refuse_foreign_challenge(registry_host: str, target: str, how: str) -> Failure:
    """A 401 from a host the registry sent the request to (`how`: "redirected GET /v2/... to"): its challenge
    gets no credential (rule 2), so the request cannot succeed there."""
    return Failure(f"registry {registry_host} {how} {host_of(target)}, which asks for credentials: none are sent "
                   "there (a registry's credentials go only to the registry and to the token service its own "
                   "challenge names)", rule="registry-redirect",
                   hint=f"that host must serve without credentials (as storage behind signed URLs does); ask the "
                        f"operator of {registry_host}")
