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
5. One URL, one host: every URL a registry or its token service answers (a redirect, an upload Location, a
   token realm) is read once, strictly, into a run.weburl.WebUrl, and this object is both what rules 1-3 judge
   and what the request is built from; a URL whose text parsers could read as two hosts (a backslash in its
   authority, whitespace, control characters, non-ASCII, a user:password@ part, a host that is a number) is
   refused under `url-ambiguous` before any request. (urlsplit read `http://a:1\\@registry/` as the
   registry while urllib3 connected to `a:1`: the Authorization went there.)
"""
from __future__ import annotations

from typing import Iterable, Mapping

from ...errors import ConfigError, Failure, Location
from ...model.registry import host_problem
from .. import weburl
from ..weburl import WebUrl

ENVIRONMENT_REGISTRY = "XLA_IMAGES_REGISTRY"
MAX_REDIRECTS = 10
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
FOLLOWED_METHODS = ("GET", "HEAD")

Origin = weburl.Origin


def url_of(text: str | WebUrl, who: str) -> WebUrl:
    """The one reading of a URL (rule 5): a WebUrl is taken as it is, a text parsed strictly or refused."""
    return text if isinstance(text, WebUrl) else weburl.parse(text, who=who)


def origin(url: str | WebUrl) -> Origin:
    """(scheme, host, port) of an absolute URL, the port made explicit: what "the same host" compares."""
    return url_of(url, "a registry").origin


def path_of(url: str | WebUrl) -> str:
    """The path of a URL (an upload Location), for messages; a Failure when it is not a URL read one way."""
    if isinstance(url, str) and url.startswith("/"):
        return url.partition("?")[0]
    return url_of(url, "a registry").path


def same_origin(url: str | WebUrl, other: str | WebUrl) -> bool:
    return origin(url) == origin(other)


def host_of(url: str | WebUrl) -> str:
    """`HOST[:PORT]` of a URL as a message shows it (never a user:password part)."""
    try:
        return url_of(url, "a registry").netloc
    except Failure:
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


def redirect_target(current: WebUrl, location: str | None, method: str, hops: int, who: str) -> WebUrl | None:
    """The URL a redirect answer sends a request to, or None when it is not to be followed; refused under
    `url-ambiguous` (rule 5) before it is asked when its text could name two hosts."""
    if method not in FOLLOWED_METHODS or not location:
        return None
    if hops >= MAX_REDIRECTS:
        raise Failure(f"{current.netloc} redirected {method} more than {MAX_REDIRECTS} times",
                      rule="registry-redirect", hint="the registry or its storage redirects in a loop")
    if location.lower().startswith(("http:", "https:", "//", "/")) or "://" not in location:
        return current.join(location, who=who)
    raise Failure(f"{current.netloc} redirected {method} to a URL that is not http(s)",
                  rule="registry-redirect", hint="a registry redirects blob reads to http(s) storage only")


def refuse_foreign_challenge(registry_host: str, target: str, how: str) -> Failure:
    """A 401 from a host the registry sent the request to (`how`: "redirected GET /v2/... to"): its challenge
    gets no credential (rule 2), so the request cannot succeed there."""
    return Failure(f"registry {registry_host} {how} {host_of(target)}, which asks for credentials: none are sent "
                   "there (a registry's credentials go only to the registry and to the token service its own "
                   "challenge names)", rule="registry-redirect",
                   hint=f"that host must serve without credentials (as storage behind signed URLs does); ask the "
                        f"operator of {registry_host}")
