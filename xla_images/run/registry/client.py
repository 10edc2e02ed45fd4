"""The registry's HTTP API v2, as much of it as push, verify, resolve, promote, prune and sign need.

Every call goes through one path: the host's trust (tls.Trust: scheme, CAs, client certificate), the
credentials' Authorization (auth.Authenticator: basic or bearer, after the registry's 401 challenge), retries
of what a retry can fix (refused, reset, timed out, 429 and 5xx; exponential waits), and errors under their
own rules (errors.classify). Answers are checked before use (answers: sizes, JSON shapes, digests).
"""
from __future__ import annotations

import hashlib
import http.cookiejar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
import tenacity
from requests.adapters import HTTPAdapter

from ...errors import Failure
from ...model.registry import Registry
from . import answers, policy
from .auth import Authenticator, auth_refused
from .credentials import Credentials
from .errors import RegistryDown, classify, unreachable_hint
from .tls import Trust, load_trust

# Everything a registry may answer for a tag: single-platform manifests and indexes, Docker and OCI.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
)
ACCEPT_MANIFESTS = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
# Answers a registry gives while it is overloaded or restarting (a 500 is often a storage hiccup): retried.
RETRIED_STATUSES = (429, 500, 502, 503, 504)
MAX_TAG_PAGES = 100


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_wait: float = 0.5
    max_wait: float = 8.0


class _TrustAdapter(HTTPAdapter):
    """An adapter whose TLS is exactly the Trust's context: requests adds no CA of its own (certifi)."""

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
                 session: requests.Session | None = None) -> None:
        self.registry = registry
        self.credentials = credentials
        self.trust = trust or load_trust(registry.host)
        self.scopes = (f"repository:{registry.repository}:{actions}", *extra_scopes)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.session = session or _cookieless_session()
        self._trusts: dict[str, Trust] = {}
        self._mount(self.trust)
        self.auth = Authenticator(registry.host, credentials, self._send)

    @property
    def base_url(self) -> str:
        return self.trust.base_url

    # public

    def check_reachable(self) -> None:
        """GET /v2/: 200 when a registry listens there and lets us in (a 401 challenge is answered first)."""
        response = self._request("GET", "/v2/")
        response.close()
        if response.status_code in (401, 403):
            raise auth_refused(self.registry.host, self.credentials, f"/v2/ ({response.status_code})")
        if response.status_code != 200:
            raise Failure(f"{self.registry.host} answered {response.status_code} to /v2/: not a registry",
                          rule="registry-reachable", hint=unreachable_hint(self.registry.host))

    def manifest_digest(self, reference: str) -> str | None:
        """The digest the registry serves for a tag or digest, or None when it has no such manifest."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        response = self._request("HEAD", path, headers=dict(ACCEPT_MANIFESTS))
        response.close()
        if response.status_code == 404:
            return None
        self._raise_for(response, f"HEAD manifest {reference}")
        digest = response.headers.get("Docker-Content-Digest")
        if digest:
            return answers.checked_digest(digest, self.registry.host, f"HEAD manifest {reference}")
        # Some registries omit the header on HEAD; the digest is the sha256 of the exact manifest bytes.
        fetched = self.manifest_bytes(reference)
        return None if fetched is None else fetched[2]

    def manifest(self, reference: str) -> dict[str, Any]:
        """The manifest document (layers with their compressed sizes); a Failure when there is none."""
        fetched = self.manifest_bytes(reference)
        if fetched is None:
            raise Failure(f"{self.registry.ref(reference)} has no manifest", rule="registry-manifest")
        document = answers.json_object(fetched[0], self.registry.host, f"GET manifest {reference}")
        answers.blob_list(document, self.registry.host)
        return document

    def manifest_bytes(self, reference: str) -> tuple[bytes, str, str] | None:
        """The exact manifest bytes, their media type and digest (promote copies these verbatim), or None."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        response = self._request("GET", path, headers=dict(ACCEPT_MANIFESTS), stream=True)
        if response.status_code == 404:
            response.close()
            return None
        self._raise_for(response, f"GET manifest {reference}")
        data = answers.body(response, answers.MANIFEST_LIMIT, self.registry.host, f"GET manifest {reference}")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return data, media_type, "sha256:" + hashlib.sha256(data).hexdigest()

    def tags(self) -> list[str]:
        """Every tag of the repository, following the `Link` pages a registry may split the list into."""
        found: list[str] = []
        path: str | None = f"/v2/{self.registry.repository}/tags/list"
        for _ in range(MAX_TAG_PAGES):
            if path is None:
                break
            response = self._request("GET", path, stream=True)
            if response.status_code == 404:
                response.close()
                return []
            self._raise_for(response, "list tags")
            data = answers.body(response, answers.TAGS_LIMIT, self.registry.host, "the tag list")
            found += answers.tag_list(answers.json_object(data, self.registry.host, "the tag list"),
                                      self.registry.host)
            path = _next_page(response.headers.get("Link", ""))
        return sorted(set(found))

    def tag_digests(self) -> dict[str, str]:
        """Every tag of the repository and the digest it names."""
        found = {}
        for tag in self.tags():
            digest = self.manifest_digest(tag)
            if digest is not None:
                found[tag] = digest
        return found

    def blob_json(self, digest: str) -> dict[str, Any]:
        """A small JSON blob (an image config), read bounded."""
        answers.checked_digest(digest, self.registry.host, "a manifest's config")
        response = self._request("GET", f"/v2/{self.registry.repository}/blobs/{digest}", stream=True)
        self._raise_for(response, f"GET blob {digest}")
        data = answers.body(response, answers.CONFIG_LIMIT, self.registry.host, f"GET blob {digest}")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise answers.refuse(self.registry.host, f"GET blob {digest}", "bytes of another digest")
        return answers.json_object(data, self.registry.host, f"GET blob {digest}")

    def delete_manifest(self, digest: str) -> bool:
        """Delete a manifest (every tag naming it goes too). False when it was not there."""
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
        return self._request(method, path, headers, data=data, params=params, stream=stream,
                             attempts=1 if once else None)

    def raise_for(self, response: requests.Response, what: str) -> None:
        self._raise_for(response, what)

    # plumbing

    def _request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                 data: bytes | None = None, params: dict[str, str] | None = None,
                 stream: bool = False, attempts: int | None = None) -> requests.Response:
        attempts = attempts or self.retry.attempts
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=self.retry.first_wait, max=self.retry.max_wait),
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
        url = self._url(path)
        if not policy.same_origin(url, self.base_url):
            # An upload Location on another host: no credential goes there and its challenge is not answered.
            response = self._send(method, url, headers, None, body)
            if response.status_code == 401:
                response.close()
                raise policy.refuse_foreign_challenge(self.registry.host, url, f"put the upload ({method}) on")
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

    def _url(self, path: str) -> str:
        # Upload sessions and token realms are absolute URLs; everything else is a path on this registry.
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def _send(self, method: str, path: str, headers: dict[str, str], auth: tuple[str, str] | None,
              body: dict[str, Any]) -> requests.Response:
        """One exchange; redirects of a GET or HEAD followed here (policy, rule 3): a hop that leaves the first
        URL's origin drops the Authorization header and basic `auth` for the rest, and a 401 after that is
        refused, never answered."""
        url = start = self._url(path)
        extra = {key: value for key, value in body.items() if value is not None and value is not False}
        hops, left = 0, False
        while True:
            trust = self._trust_for(url)
            try:
                response = self.session.request(method, url, headers=headers, auth=auth, timeout=self.timeout,
                                                allow_redirects=False, **extra)
            except requests.RequestException as error:
                raise classify(error, trust.host, trust.describe(), str(trust.certs_dir)) from None
            target = (policy.redirect_target(url, response.headers.get("Location"), method, hops)
                      if response.status_code in policy.REDIRECT_STATUSES else None)
            if target is None:
                break
            response.close()
            if not policy.same_origin(target, start) and not left:
                left = True
                headers = {key: value for key, value in headers.items() if key.lower() != "authorization"}
                auth = None
            extra.pop("params", None)  # the Location carries its own query
            url, hops = target, hops + 1
        if response.status_code == 401 and left:
            response.close()
            raise policy.refuse_foreign_challenge(self.registry.host, url,
                                                  f"redirected {method} {urlsplit(start).path} to")
        if response.status_code in RETRIED_STATUSES:
            response.close()
            raise RegistryDown(f"HTTP {response.status_code}")
        return response

    def _trust_for(self, url: str) -> Trust:
        host = urlsplit(url).netloc.rpartition("@")[2]
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


def _cookieless_session() -> requests.Session:
    """Docker's client keeps no cookie jar: a cookie a registry sets is sent nowhere (a jar ignores ports)."""
    session = requests.Session()
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return session


def _next_page(link: str) -> str | None:
    """The path of `Link: </v2/x/tags/list?last=a&n=100>; rel="next"`, or None."""
    if 'rel="next"' not in link or "<" not in link:
        return None
    target = link[link.index("<") + 1:link.index(">")] if ">" in link else ""
    return target if target.startswith("/v2/") else None
