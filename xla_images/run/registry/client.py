"""The registry's HTTP API v2, as much of it as push, verify, resolve, promote, prune and sign need.

Every call goes through one path: the host's trust (tls.Trust: scheme, CAs, client certificate), the
credentials' Authorization (auth.Authenticator: basic or bearer, after the registry's 401 challenge), retries
of what a retry can fix (refused, reset, timed out, 429 and 5xx; exponential waits), and errors under their
own rules (errors.classify). Answers are checked before use (answers: sizes, JSON shapes, media types, digests
equal to the ones asked for), and every exchange ends: the public reads run under an overall deadline
(run/netread.py: it bites at the socket, so a registry dribbling one byte at a time is cut, under
`registry-slow`) and read bounded bodies; tag lists are streamed page by page and capped.
"""
from __future__ import annotations

import http.cookiejar
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Iterator

import requests
import tenacity

from ...errors import Failure
from .. import netread, weburl
from ..weburl import WebUrl
from ...model.registry import Registry
from . import answers, policy
from .auth import Authenticator, auth_refused
from .credentials import Credentials
from .errors import RegistryDown, classify, unreachable_hint
from .tls import Trust, load_trust

MANIFEST_MEDIA_TYPES = answers.MANIFEST_MEDIA_TYPES
ACCEPT_MANIFESTS = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
# Answers a registry gives while it is overloaded or restarting (a 500 is often a storage hiccup): retried.
RETRIED_STATUSES = (429, 500, 502, 503, 504)
# The overall deadline of one exchange (request, token round, answer): bodies here are at most a few MiB.
DEADLINE = 120.0
# Exchanges that move many bytes (a blob, an upload chunk) get DEADLINE plus their size at this slowest rate.
SLOWEST_RATE = 1 << 20  # bytes per second
# A tag list: at most this many pages (a registry whose `Link` never ends), all within TAGS_DEADLINE.
MAX_TAG_PAGES = 1000
TAGS_DEADLINE = 900.0
# All of tag_digests' HEADs (at most MAX_TAG_DIGESTS): ~0.3 s each on a remote registry is 25 minutes.
TAG_DIGESTS_DEADLINE = 1800.0
# tag_digests asks one HEAD per tag: prune's repositories hold hundreds; more than this is refused, not waited out.
MAX_TAG_DIGESTS = 5000


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_wait: float = 0.5
    max_wait: float = 8.0


class _TrustAdapter(netread.DeadlineAdapter):
    """An adapter whose TLS is exactly the Trust's context: requests adds no CA of its own (certifi); its reads
    end at the current netread deadline."""

    def __init__(self, context: Any) -> None:
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self._context
        super().init_poolmanager(*args, **kwargs)

    def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["ssl_context"] = self._context
        return super().proxy_manager_for(*args, **kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        conn.cert_reqs = "CERT_REQUIRED"
        conn.ca_certs = None
        conn.ca_cert_dir = None

    def build_connection_pool_key_attributes(self, request: Any, verify: Any, cert: Any = None) -> Any:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, True, None)
        for key in ("ca_certs", "ca_cert_dir", "cert_file", "key_file"):
            pool_kwargs.pop(key, None)
        pool_kwargs["cert_reqs"] = "CERT_REQUIRED"
        return host_params, pool_kwargs


class RegistryClient:
    """One repository on one registry, with one set of credentials and the scopes the caller needs."""

    def __init__(self, registry: Registry, credentials: Credentials | None = None, *,
                 actions: str = "pull,push,delete", extra_scopes: tuple[str, ...] = (),
                 trust: Trust | None = None, retry: RetryPolicy | None = None, timeout: float = 30.0,
                 session: requests.Session | None = None, deadline: float = DEADLINE) -> None:
        self.registry = registry
        self.credentials = credentials
        self.trust = trust or load_trust(registry.host)
        self.scopes = (f"repository:{registry.repository}:{actions}", *extra_scopes)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout  # per socket read; `deadline` bounds each whole exchange
        self.deadline = deadline
        self.session = session or _cookieless_session()
        self._trusts: dict[str, Trust] = {}
        self.session.mount("http://", netread.DeadlineAdapter())  # https hosts get a _TrustAdapter (_mount)
        self._mount(self.trust)
        self.auth = Authenticator(registry.host, credentials, self._send)

    @property
    def base_url(self) -> str:
        return self.trust.base_url

    # public

    def exchange(self, what: str, seconds: float | None = None) -> AbstractContextManager[netread.Deadline]:
        """An overall deadline (`registry-slow`) for what the block asks of this registry and reads back."""
        return netread.deadline(self.deadline if seconds is None else seconds, host=f"registry {self.registry.host}",
                                what=what, rule="registry-slow")

    def deadline_for(self, size: int) -> float:
        """The deadline of an exchange moving `size` bytes: DEADLINE plus the size at the slowest accepted rate."""
        return self.deadline + max(size, 0) / SLOWEST_RATE

    def check_reachable(self) -> None:
        """GET /v2/: 200 when a registry listens there and lets us in (a 401 challenge is answered first)."""
        with self.exchange("GET /v2/"):
            response = self._request("GET", "/v2/")
            response.close()
        if response.status_code in (401, 403):
            raise auth_refused(self.registry.host, self.credentials, f"/v2/ ({response.status_code})")
        if response.status_code != 200:
            raise Failure(f"{self.registry.host} answered {response.status_code} to /v2/: not a registry",
                          rule="registry-reachable", hint=unreachable_hint(self.registry.host))

    def manifest_digest(self, reference: str) -> str | None:
        """The digest the registry serves for a tag or digest, or None when it has no such manifest.
        Asked by digest, the answer must be that digest; without a Docker-Content-Digest header the manifest is
        fetched, checked to be one, and hashed."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        what = f"HEAD manifest {reference}"
        with self.exchange(what):
            response = self._request("HEAD", path, headers=dict(ACCEPT_MANIFESTS))
            response.close()
        if response.status_code == 404:
            return None
        self._raise_for(response, what)
        digest = response.headers.get("Docker-Content-Digest")
        if digest:
            digest = answers.checked_digest(digest, self.registry.host, what)
            if answers.is_digest(reference):
                answers.digest_equal(digest, reference, self.registry.host, what)
            return digest
        # Some registries omit the header on HEAD; the digest is the sha256 of the exact manifest bytes.
        fetched = self.manifest_bytes(reference)
        return None if fetched is None else fetched[2]

    def manifest(self, reference: str) -> dict[str, Any]:
        """The manifest document (layers with their compressed sizes); a Failure when there is none."""
        fetched = self.manifest_bytes(reference)
        if fetched is None:
            raise Failure(f"{self.registry.ref(reference)} has no manifest", rule="registry-manifest")
        return answers.json_object(fetched[0], self.registry.host, f"GET manifest {reference}")

    def manifest_bytes(self, reference: str) -> tuple[bytes, str, str] | None:
        """The exact manifest bytes, their media type and digest (promote copies these verbatim), or None.
        Verified: a manifest or index of a known media type, hashing to the digest asked for (by digest) and to
        the Docker-Content-Digest the registry sent (by tag)."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        what = f"GET manifest {reference}"
        with self.exchange(what):
            response = self._request("GET", path, headers=dict(ACCEPT_MANIFESTS), stream=True)
            if response.status_code == 404:
                response.close()
                return None
            self._raise_for(response, what)
            data = answers.body(response, answers.MANIFEST_LIMIT, self.registry.host, what)
        digest = answers.sha256(data)
        if answers.is_digest(reference):
            answers.digest_equal(digest, reference, self.registry.host, what)
        served = response.headers.get("Docker-Content-Digest")
        if served:
            answers.digest_equal(digest, answers.checked_digest(served, self.registry.host, what),
                                 self.registry.host, f"{what} (its bytes against its Docker-Content-Digest)")
        _, media_type = answers.manifest_document(data, response.headers.get("Content-Type", ""),
                                                  self.registry.host, what)
        return data, media_type, digest

    def tags(self) -> list[str]:
        """Every tag of the repository (at most answers.MAX_TAGS), sorted."""
        return sorted(set(self.iter_tags()))

    def iter_tags(self) -> Iterator[str]:
        """The tags page by page as the registry sends them, following `Link` pages: each page bounded, at most
        MAX_TAG_PAGES pages and answers.MAX_TAGS tags, all within TAGS_DEADLINE (no deadline stays in force
        between pages: the consumer may ask other things meanwhile)."""
        path: str | None = f"/v2/{self.registry.repository}/tags/list"
        whole = netread.Deadline(TAGS_DEADLINE, f"registry {self.registry.host}", "the tag list")
        count = 0
        for _ in range(MAX_TAG_PAGES):
            if path is None:
                return
            if whole.passed():
                raise whole.failure()
            page, path = self._tag_page(path, min(self.deadline, whole.remaining()))
            count += len(page)
            if count > answers.MAX_TAGS:
                raise _too_many(self.registry.host, f"more than {answers.MAX_TAGS} tags", "tags")
            yield from page
        if path is not None:
            raise _too_many(self.registry.host, f"more than {MAX_TAG_PAGES} pages of tags", "tags")

    def _tag_page(self, path: str, seconds: float) -> tuple[list[str], str | None]:
        with self.exchange(f"GET {path.split('?')[0]}", seconds):
            response = self._request("GET", path, stream=True)
            if response.status_code == 404:
                response.close()
                return [], None
            self._raise_for(response, "list tags")
            data = answers.body(response, answers.TAGS_LIMIT, self.registry.host, "the tag list")
        page = answers.tag_list(answers.json_object(data, self.registry.host, "the tag list"), self.registry.host)
        return page, _next_page(response.headers.get("Link", ""))

    def tag_digests(self, limit: int = MAX_TAG_DIGESTS) -> dict[str, str]:
        """Every tag of the repository and the digest it names: one HEAD per tag, so at most `limit` tags."""
        tags = []
        for tag in self.iter_tags():
            tags.append(tag)
            if len(tags) > limit:
                raise _too_many(self.registry.host, f"more than {limit} tags, one HEAD each", "tag digests")
        found = {}
        # The HEADs together end too: `limit` of them at the per-exchange deadline each would hold prune for days.
        with self.exchange(f"HEAD of {len(set(tags))} tags", TAG_DIGESTS_DEADLINE):
            for tag in sorted(set(tags)):
                digest = self.manifest_digest(tag)
                if digest is not None:
                    found[tag] = digest
        return found

    def blob_json(self, digest: str) -> dict[str, Any]:
        """A small JSON blob (an image config), read bounded and checked against its digest."""
        answers.checked_digest(digest, self.registry.host, "a manifest's config")
        what = f"GET blob {digest}"
        with self.exchange(what):
            response = self._request("GET", f"/v2/{self.registry.repository}/blobs/{digest}", stream=True)
            self._raise_for(response, what)
            data = answers.body(response, answers.CONFIG_LIMIT, self.registry.host, what)
        answers.digest_equal(answers.sha256(data), digest, self.registry.host, what)
        return answers.json_object(data, self.registry.host, what)

    def delete_manifest(self, digest: str) -> bool:
        """Delete a manifest (every tag naming it goes too). False when it was not there."""
        with self.exchange(f"DELETE manifest {digest}"):
            response = self._request("DELETE", f"/v2/{self.registry.repository}/manifests/{digest}")
            response.close()
        if response.status_code == 404:
            return False
        self._raise_for(response, f"DELETE manifest {digest}")
        return True

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                data: bytes | None = None, params: dict[str, str] | None = None,
                stream: bool = False, once: bool = False) -> requests.Response:
        """Any API call with this client's trust, retries and credentials; `path` may be an upload's Location.
        `once`: a single attempt (a best-effort clean-up must not wait out a registry that is down)."""
        if stream:  # the body is read after this returns: the caller holds the deadline (exchange, deadline_for)
            return self._request(method, path, headers, data=data, params=params, stream=stream,
                                 attempts=1 if once else None)
        with self.exchange(f"{method} {policy.path_of(path)}", self.deadline_for(len(data or b""))):
            return self._request(method, path, headers, data=data, params=params, attempts=1 if once else None)

    def raise_for(self, response: requests.Response, what: str) -> None:
        self._raise_for(response, what)

    # plumbing

    def _request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                 data: bytes | None = None, params: dict[str, str] | None = None,
                 stream: bool = False, attempts: int | None = None) -> requests.Response:
        attempts = attempts or self.retry.attempts
        retrying = tenacity.Retrying(
            # No retry, and no wait, past the current deadline: the exchange then fails as `registry-slow`.
            stop=tenacity.stop_any(tenacity.stop_after_attempt(attempts), _deadline_passed),
            wait=_within_deadline(tenacity.wait_exponential(multiplier=self.retry.first_wait,
                                                            max=self.retry.max_wait)),
            retry=tenacity.retry_if_exception_type(RegistryDown),
            reraise=True,
        )
        try:
            return retrying(self._send_authenticated, method, path, dict(headers or {}),
                            {"data": data, "params": params, "stream": stream})
        except RegistryDown as down:
            raise Failure(f"registry {self.registry.host} does not answer ({down}) after "
                          f"{attempts} attempt(s)", rule="registry-reachable",
                          hint=unreachable_hint(self.registry.host)) from None

    def _send_authenticated(self, method: str, path: str, headers: dict[str, str],
                            body: dict[str, Any]) -> requests.Response:
        url = self._url(path)  # the one reading: judged here, connected to in _send
        if url.origin != self._base.origin:
            # An upload Location on another host: no credential goes there and its challenge is not answered.
            response = self._send(method, url, headers, None, body)
            if response.status_code == 401:
                response.close()
                raise policy.refuse_foreign_challenge(self.registry.host, url.text, f"put the upload ({method}) on")
            return response
        first = self.auth.header(self.scopes)
        if first:
            headers["Authorization"] = first
        response = self._send(method, url, headers, None, body)
        if response.status_code != 401:
            return response
        # A 401 from the registry itself (one after a redirect elsewhere raised in _send): its own challenge.
        answer = self.auth.answer(response.headers.get("WWW-Authenticate", ""), self.scopes)
        if answer is None or (answer == first and self.auth.scheme != "bearer"):
            return response  # nothing else to try: the caller turns the 401 into a registry-auth Failure
        response.close()
        headers["Authorization"] = answer
        return self._send(method, url, headers, None, body)

    @property
    def _base(self) -> WebUrl:
        return weburl.parse(self.base_url + "/", who=f"the registry {self.registry.host}")

    def _url(self, path: str | WebUrl) -> WebUrl:
        """The strict reading (policy, rule 5) of what is asked: upload sessions and token realms are absolute
        URLs a registry answered (refused under `url-ambiguous` when they could name two hosts); everything
        else is a path on this registry."""
        if isinstance(path, WebUrl):
            return path
        who = f"registry {self.registry.host}"
        return weburl.parse(path if "://" in path else self.base_url + path, who=who)

    def _send(self, method: str, path: str | WebUrl, headers: dict[str, str], auth: tuple[str, str] | None,
              body: dict[str, Any]) -> requests.Response:
        """One exchange; redirects of a GET or HEAD followed here (policy, rule 3): a hop that leaves the first
        URL's origin drops the Authorization header and basic `auth` for the rest, and a 401 after that is
        refused, never answered. Each hop's URL is one WebUrl: the origin compared is the host connected to."""
        url = start = self._url(path)
        extra = {key: value for key, value in body.items() if value is not None and value is not False}
        streamed = bool(extra.pop("stream", False))
        hops, left = 0, False
        while True:
            response = self._send_once(method, url, headers, auth, extra)
            target = (policy.redirect_target(url, response.headers.get("Location"), method, hops,
                                             f"registry {self.registry.host}")
                      if response.status_code in policy.REDIRECT_STATUSES else None)
            if target is None:
                break
            response.close()
            if target.origin != start.origin and not left:
                left = True
                headers = {key: value for key, value in headers.items() if key.lower() != "authorization"}
                auth = None
            extra.pop("params", None)  # the Location carries its own query
            url, hops = target, hops + 1
        if response.status_code == 401 and left:
            response.close()
            raise policy.refuse_foreign_challenge(self.registry.host, url, f"redirected {method} {start.path} to")
        if response.status_code in RETRIED_STATUSES:
            response.close()
            raise RegistryDown(f"HTTP {response.status_code}")
        if not streamed:
            _read_small_answer(response, method, self.registry.host, f"{method} {start.path}")
        return response

    def _send_once(self, method: str, url: WebUrl, headers: dict[str, str], auth: tuple[str, str] | None,
                   extra: dict[str, Any]) -> requests.Response:
        trust = self._trust_for(url)
        try:
            return weburl.send(self.session, method, url, who=f"registry {self.registry.host}", headers=headers,
                               auth=auth, timeout=self.timeout, stream=True, **extra)
        except requests.RequestException as error:
            raise classify(error, trust.host, trust.describe(), str(trust.certs_dir)) from None

    def _trust_for(self, url: WebUrl) -> Trust:
        host = url.netloc
        if host == self.registry.host:
            return self.trust
        if host not in self._trusts:  # a token realm or storage redirect elsewhere: trusted as the engine would
            self._mount(load_trust(host))
        return self._trusts[host]

    def _mount(self, trust: Trust) -> None:
        self._trusts[trust.host] = trust
        if trust.scheme == "https":
            self.session.mount(f"https://{trust.host}/", _TrustAdapter(trust.ssl_context()))

    def _raise_for(self, response: requests.Response, what: str) -> None:
        if response.status_code in (401, 403):
            response.close()
            raise auth_refused(self.registry.host, self.credentials, f"{what} ({response.status_code})")
        if response.status_code >= 400:
            response.close()
            raise Failure(f"registry {self.registry.host}: {what} failed with HTTP {response.status_code}",
                          rule="registry-request")


def _deadline_passed(_state: tenacity.RetryCallState) -> bool:
    now = netread.current()
    return now is not None and now.passed()


def _within_deadline(wait: Any) -> Any:
    def bounded(state: tenacity.RetryCallState) -> float:
        now = netread.current()
        return float(wait(state)) if now is None else max(0.0, min(float(wait(state)), now.remaining()))
    return bounded


def _too_many(host: str, what: str, of: str) -> Failure:
    return Failure(f"registry {host}: the repository has {what}", rule="registry-too-many-tags",
                   hint=f"the {of} of a repository this large are more than one command reads; delete old tags "
                        "with the registry's own tools, or use a repository per purpose")


def _cookieless_session() -> requests.Session:
    """Docker's client keeps no cookie jar: a cookie a registry sets is sent nowhere (a jar ignores ports)."""
    session = requests.Session()
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return session


def _read_small_answer(response: requests.Response, method: str, host: str, what: str) -> None:
    """An answer the caller did not ask to stream (/v2/, an upload's, a DELETE's, an error's) is small: read it
    now, bounded, as requests would have read it whole before any check (an endless body grew until memory ran
    out). `.content` then serves the bytes, as for any unstreamed response. A HEAD answer has no body: its
    Content-Length is the size of what a GET would send (a blob's), not a body to bound."""
    if method == "HEAD":
        response.close()
        response._content, response._content_consumed = b"", True
        return
    data = answers.body(response, answers.SMALL_ANSWER_LIMIT, host, what)
    response._content, response._content_consumed = data, True  # requests' own fields for a body already read


def _next_page(link: str) -> str | None:
    """The path of `Link: </v2/x/tags/list?last=a&n=100>; rel="next"`, or None."""
    if 'rel="next"' not in link or "<" not in link:
        return None
    target = link[link.index("<") + 1:link.index(">")] if ">" in link else ""
    return target if target.startswith("/v2/") else None
