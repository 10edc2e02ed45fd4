"""Push flavour images to a registry and prove every tag and alias resolves to the pushed digest.

The order is what keeps a registry consistent when anything fails half-way: the canonical tag is pushed and
verified first (HTTP API v2: the manifest digest the registry serves for the tag), and only then each alias,
so an alias never names a manifest the registry does not hold. published.json gains a flavour only once all
its tags are verified; it is rewritten atomically, merged with what it held.

Credentials come from XLA_IMAGES_REGISTRY_USER / XLA_IMAGES_REGISTRY_PASSWORD or from the docker config
(`auths` in $DOCKER_CONFIG/config.json or ~/.docker/config.json). They are passed to the engine and the
registry only: never printed, logged or written, and scrubbed from any error message.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import requests
import tenacity

from .. import diskio
from ..errors import ConfigError, Failure, Location, XlaImagesError
from ..model.published import Published, is_digest, parse_published, read_published
from ..model.published import document as published_document
from ..model.registry import Registry
from ..model.target import Target
from ..names import FLAVOUR_ID_LABEL, local_ref
from . import engine, nightly_check

USER_ENV = "XLA_IMAGES_REGISTRY_USER"
PASSWORD_ENV = "XLA_IMAGES_REGISTRY_PASSWORD"
REGISTRY_START_HINT = (
    "start the suite registry with `ci/registry.sh start`, or pass the right --registry HOST[:PORT]/REPO")
# Everything a registry may answer for a tag: single-platform manifests and indexes, Docker and OCI.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
)
# Answers a registry gives while it is overloaded or restarting (a 500 is often a storage hiccup): retried.
RETRIED_STATUSES = (429, 500, 502, 503, 504)
# dockerd retries a failed layer upload itself (5 times, ~50 s), but not the manifest PUT that ends a push:
# such an answer there is worth one more push (layers already up are skipped). Connection errors are not
# retried here: they come out of dockerd's own layer retries, which already took their time.
_TRANSIENT_PUSH = re.compile(r"unexpected HTTP status: (?:%s)\b" % "|".join(map(str, RETRIED_STATUSES)))


# --- credentials -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = "environment"

    def auth_config(self, host: str) -> dict[str, str]:
        """What the engine's push/pull take."""
        return {"username": self.username, "password": self.password, "serveraddress": host}

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in output: the password and the encodings it travels in."""
        pair = f"{self.username}:{self.password}".encode()
        return tuple(s for s in (self.password, base64.b64encode(pair).decode(),
                                 base64.urlsafe_b64encode(pair).decode()) if s)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password='***', source={self.source!r})"


def load_credentials(host: str, environ: Mapping[str, str] | None = None,
                     docker_config: Path | None = None) -> Credentials | None:
    """Environment first (CI secrets), then the docker config's `auths` entry for `host`, else anonymous."""
    environ = os.environ if environ is None else environ
    user, password = environ.get(USER_ENV), environ.get(PASSWORD_ENV)
    if user or password:
        if not (user and password):
            missing = PASSWORD_ENV if user else USER_ENV
            raise ConfigError(f"{missing} is not set but its partner is", rule="registry-credentials",
                              hint=f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
        return Credentials(user, password, "environment")
    path = docker_config or _docker_config_path(environ)
    return _credentials_from_docker_config(path, host)


def _docker_config_path(environ: Mapping[str, str]) -> Path:
    directory = environ.get("DOCKER_CONFIG")
    return Path(directory) / "config.json" if directory else Path.home() / ".docker" / "config.json"


def _credentials_from_docker_config(path: Path, host: str) -> Credentials | None:
    if not path.is_file():
        return None
    try:
        auths = json.loads(path.read_text(encoding="utf-8")).get("auths") or {}
    except (OSError, ValueError, AttributeError):
        raise ConfigError("cannot read the docker config", location=Location(str(path)), rule="docker-config",
                          hint="fix the JSON (`docker login` rewrites it)") from None
    for key, entry in auths.items():
        if _auth_key_host(key) != host or not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                sep = ""
            if not sep:
                # Never echo the value: it is a secret even when malformed.
                raise ConfigError(f"the auth entry for {host} is not base64 of USER:PASSWORD",
                                  location=Location(str(path)), rule="docker-config",
                                  hint=f"run `docker login {host}` again")
            return Credentials(user, password, str(path))
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], str(path))
    return None


def _auth_key_host(key: str) -> str:
    """`https://host:5000/v1/` -> `host:5000`, as docker login writes keys in several spellings."""
    key = re.sub(r"^[a-z]+://", "", key)
    return key.split("/", 1)[0]


def redact(text: str, credentials: Credentials | None) -> str:
    if credentials is None:
        return text
    for secret in credentials.secrets:
        text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def redacting(credentials: Credentials | None) -> Iterator[None]:
    """Scrub secrets out of any error raised inside (engine and registry messages may quote requests)."""
    try:
        yield
    except XlaImagesError as error:
        error.message = redact(error.message, credentials)
        error.hint = redact(error.hint, credentials) if error.hint else error.hint
        error.args = (error.message,)
        raise


# --- the registry's HTTP API v2 --------------------------------------------------------------------------

class RegistryDown(Exception):
    """Connection refused, reset or timed out: worth retrying, then a Failure naming the registry."""


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_wait: float = 0.5
    max_wait: float = 8.0


class RegistryClient:
    """Just enough of the distribution API to verify pushes: manifests by tag or digest, tags, delete."""

    def __init__(self, registry: Registry, credentials: Credentials | None = None, *,
                 retry: RetryPolicy | None = None, timeout: float = 30.0,
                 session: requests.Session | None = None) -> None:
        self.registry = registry
        self.credentials = credentials
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.session = session or requests.Session()
        self._bearer: dict[str, str] = {}

    # public

    def check_reachable(self) -> None:
        """GET /v2/: answers 200 (or 401 asking for credentials) when a registry listens there."""
        response = self._request("GET", "/v2/")
        if response.status_code not in (200, 401):
            raise Failure(f"{self.registry.host} answered {response.status_code} to /v2/: not a registry",
                          rule="registry-reachable", hint=REGISTRY_START_HINT)

    def manifest_digest(self, reference: str) -> str | None:
        """The digest the registry serves for a tag or digest, or None when it has no such manifest."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        response = self._request("HEAD", path, headers={"Accept": ", ".join(MANIFEST_MEDIA_TYPES)})
        if response.status_code == 404:
            return None
        self._raise_for(response, f"HEAD manifest {reference}")
        digest = response.headers.get("Docker-Content-Digest")
        if digest:
            return digest
        # Some registries omit the header on HEAD; the digest is the sha256 of the exact manifest bytes.
        body = self._request("GET", path, headers={"Accept": ", ".join(MANIFEST_MEDIA_TYPES)})
        self._raise_for(body, f"GET manifest {reference}")
        return "sha256:" + hashlib.sha256(body.content).hexdigest()

    def manifest(self, reference: str) -> dict[str, Any]:
        """The manifest document (layers with their compressed sizes); a Failure when there is none."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        response = self._request("GET", path, headers={"Accept": ", ".join(MANIFEST_MEDIA_TYPES)})
        if response.status_code == 404:
            raise Failure(f"{self.registry.ref(reference)} has no manifest", rule="registry-manifest")
        self._raise_for(response, f"GET manifest {reference}")
        return dict(response.json())

    def tags(self) -> list[str]:
        response = self._request("GET", f"/v2/{self.registry.repository}/tags/list")
        if response.status_code == 404:
            return []
        self._raise_for(response, "list tags")
        return sorted(response.json().get("tags") or [])

    def manifest_bytes(self, reference: str) -> tuple[bytes, str, str] | None:
        """The exact manifest bytes, their media type and digest (promote copies these verbatim), or None."""
        path = f"/v2/{self.registry.repository}/manifests/{reference}"
        response = self._request("GET", path, headers={"Accept": ", ".join(MANIFEST_MEDIA_TYPES)})
        if response.status_code == 404:
            return None
        self._raise_for(response, f"GET manifest {reference}")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return response.content, media_type, "sha256:" + hashlib.sha256(response.content).hexdigest()

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                data: bytes | None = None, params: dict[str, str] | None = None,
                stream: bool = False) -> requests.Response:
        """Any API call with this client's retries and credentials; `path` may be an upload's Location URL."""
        return self._request(method, path, headers, data=data, params=params, stream=stream)

    def raise_for(self, response: requests.Response, what: str) -> None:
        self._raise_for(response, what)

    def delete_manifest(self, digest: str) -> bool:
        """Delete a manifest (every tag naming it goes too). False when it was not there."""
        response = self._request("DELETE", f"/v2/{self.registry.repository}/manifests/{digest}")
        if response.status_code == 404:
            return False
        self._raise_for(response, f"DELETE manifest {digest}")
        return True

    # plumbing

    def _request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                 data: bytes | None = None, params: dict[str, str] | None = None,
                 stream: bool = False) -> requests.Response:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retry.attempts),
            wait=tenacity.wait_exponential(multiplier=self.retry.first_wait, max=self.retry.max_wait),
            retry=tenacity.retry_if_exception_type(RegistryDown),
            reraise=True,
        )
        try:
            return retrying(self._send_authenticated, method, path, dict(headers or {}),
                            {"data": data, "params": params, "stream": stream})
        except RegistryDown as down:
            raise Failure(f"registry {self.registry.host} does not answer ({down}) after "
                          f"{self.retry.attempts} attempt(s)", rule="registry-reachable",
                          hint=REGISTRY_START_HINT) from None

    def _send_authenticated(self, method: str, path: str, headers: dict[str, str],
                            body: dict[str, Any] | None = None) -> requests.Response:
        scope = f"repository:{self.registry.repository}:pull,push,delete"
        if scope in self._bearer:
            headers["Authorization"] = f"Bearer {self._bearer[scope]}"
        response = self._send(method, path, headers, self._basic(), body)
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code == 401 and challenge.lower().startswith("bearer") and scope not in self._bearer:
            self._bearer[scope] = self._fetch_token(challenge, scope)
            headers["Authorization"] = f"Bearer {self._bearer[scope]}"
            response = self._send(method, path, headers, None, body)
        return response

    def _basic(self) -> tuple[str, str] | None:
        return (self.credentials.username, self.credentials.password) if self.credentials else None

    def _send(self, method: str, path: str, headers: dict[str, str],
              auth: tuple[str, str] | None, body: dict[str, Any] | None = None) -> requests.Response:
        # Upload sessions answer with an absolute Location URL; everything else is a path on this registry.
        url = path if path.startswith(("http://", "https://")) else self.registry.base_url + path
        extra = {key: value for key, value in (body or {}).items() if value is not None and value is not False}
        try:
            response = self.session.request(method, url, headers=headers, auth=auth,
                                            timeout=self.timeout, allow_redirects=True, **extra)
        except (requests.ConnectionError, requests.Timeout) as error:
            raise RegistryDown(_connection_reason(error)) from None
        except requests.RequestException as error:
            raise Failure(f"registry {self.registry.host}: {type(error).__name__}", rule="registry-request",
                          hint=REGISTRY_START_HINT) from None
        if response.status_code in RETRIED_STATUSES:
            raise RegistryDown(f"HTTP {response.status_code}")
        return response

    def _fetch_token(self, challenge: str, scope: str) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise Failure(f"registry {self.registry.host} asks for a token without a realm",
                          rule="registry-auth")
        params["scope"] = scope
        try:
            response = self.session.get(realm, params=params, auth=self._basic(), timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout) as error:
            raise RegistryDown(_connection_reason(error)) from None
        if response.status_code != 200:
            raise Failure(f"registry {self.registry.host} refused a token ({response.status_code})",
                          rule="registry-auth", hint=f"check {USER_ENV}/{PASSWORD_ENV} or `docker login`")
        body = response.json()
        return str(body.get("token") or body.get("access_token") or "")

    def _raise_for(self, response: requests.Response, what: str) -> None:
        if response.status_code in (401, 403):
            raise Failure(f"registry {self.registry.host} refused {what} ({response.status_code})",
                          rule="registry-auth",
                          hint=f"set {USER_ENV}/{PASSWORD_ENV} or run `docker login {self.registry.host}`")
        if response.status_code >= 400:
            raise Failure(f"registry {self.registry.host}: {what} failed with HTTP {response.status_code}",
                          rule="registry-request")


def _connection_reason(error: Exception) -> str:
    """A short reason without the URL machinery (and so without anything a URL might carry)."""
    text = str(error)
    for reason in ("Connection refused", "Connection reset", "timed out", "Name or service not known",
                   "No route to host", "Remote end closed connection"):
        if reason.lower() in text.lower():
            return reason.lower()
    return type(error).__name__


# --- push ------------------------------------------------------------------------------------------------

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Transfer:
    """What one flavour's push moved: the registry deduplicates layers by digest, so a flavour sharing layers
    with one pushed before sends only its own. Sizes are the compressed blob sizes of the pushed manifest."""

    uploaded_bytes: int
    present_bytes: int
    uploaded_layers: int
    present_layers: int

    def describe(self) -> str:
        return (f"uploaded {self.uploaded_bytes / 1e6:.1f} MB in {self.uploaded_layers} layer(s), "
                f"{self.present_bytes / 1e6:.1f} MB in {self.present_layers} layer(s) already present")


def transfer_of(diff_ids: list[str], manifest: dict[str, Any], status: dict[str, str]) -> Transfer:
    """Pair the image's layers (diff ids, bottom first) with the manifest's blobs (same order) and the push's
    per-layer status; a layer the engine did not report on was not sent (it counts as present)."""
    blobs = manifest.get("layers") or []
    if len(blobs) != len(diff_ids):
        raise Failure(f"the pushed manifest has {len(blobs)} layers, the image {len(diff_ids)}", rule="push-verified")
    counted: set[str] = set()
    sizes = {"uploaded": [0, 0], "present": [0, 0]}
    for diff_id, blob in zip(diff_ids, blobs):
        if blob["digest"] in counted:
            continue  # one blob, stored and sent once, whatever number of layers use it
        counted.add(blob["digest"])
        kind = status.get(diff_id.removeprefix("sha256:")[:12], "present")
        sizes[kind][0] += int(blob.get("size") or 0)
        sizes[kind][1] += 1
    return Transfer(sizes["uploaded"][0], sizes["present"][0], sizes["uploaded"][1], sizes["present"][1])


def push_flavour(flavour: Target, registry: Registry, client: RegistryClient,
                 credentials: Credentials | None, progress: Progress = lambda line: None,
                 transfers: dict[str, Transfer] | None = None) -> Published:
    """Push the flavour's tag, verify it, then each alias; return the verified record.

    Reports the bytes uploaded vs already present (and records them in `transfers`, when given, by tag).
    """
    image = local_ref(flavour.tag)
    with redacting(credentials):
        labels = _built_labels(flavour, image)
        client.check_reachable()
        auth = credentials.auth_config(registry.host) if credentials else None
        progress(f"{flavour.tag}: pushing {image} to {registry.ref(flavour.tag)}")
        status: dict[str, str] = {}
        digest = _push_tag(image, registry, flavour.tag, auth, progress, client.retry, status)
        _verify(client, registry, flavour.tag, digest)
        if status:  # the engine reported per layer (it always does; a fake in unit tests may not)
            transfer = transfer_of(engine.images.image_layers(image), client.manifest(digest), status)
            if transfers is not None:
                transfers[flavour.tag] = transfer
            progress(f"{flavour.tag}: {transfer.describe()}")
        progress(f"{flavour.tag}: verified {registry.digest_ref(digest)}")
        for alias in flavour.aliases:
            alias_digest = _push_tag(image, registry, alias, auth, progress, client.retry)
            if alias_digest != digest:
                raise Failure(f"alias {alias} was pushed as {alias_digest}, not {digest} like {flavour.tag}",
                              rule="push-verified", hint="the local image changed during the push; push again")
            _verify(client, registry, alias, digest)
            progress(f"{flavour.tag}: alias {registry.ref(alias)} verified")
    return Published(flavour.tag, flavour.tags, registry.name, digest, labels, flavour.to_json(), _now())


def _built_labels(flavour: Target, image: str) -> dict[str, str]:
    labels = engine.images.image_labels(image)
    if labels is None:
        raise Failure(f"{image} is not on this engine", rule="image-built",
                      hint=f"build it first: `build.py build {flavour.tag}`")
    if labels.get(FLAVOUR_ID_LABEL) != flavour.id:
        raise Failure(f"{image} was built from other inputs than the current {flavour.tag} "
                      f"(flavour id {labels.get(FLAVOUR_ID_LABEL, 'missing')[:19]}, expected {flavour.id[:19]})",
                      rule="image-built", hint=f"rebuild it: `build.py build {flavour.tag}`")
    return labels


def _push_tag(image: str, registry: Registry, tag: str, auth: dict[str, str] | None, progress: Progress,
              retry: RetryPolicy | None = None, layer_status: dict[str, str] | None = None) -> str:
    """Tag locally under the registry's name only for the push; the local tag goes whatever happens."""
    engine.images.tag_image(image, registry.name, tag)
    try:
        return _push_retrying(registry, tag, auth, progress, retry or RetryPolicy(), layer_status)
    finally:
        engine.images.remove_tag(registry.ref(tag))


def _push_retrying(registry: Registry, tag: str, auth: dict[str, str] | None, progress: Progress,
                   retry: RetryPolicy, layer_status: dict[str, str] | None = None) -> str:
    """engine.transfer.push_image, pushed again while the registry answers the push with a transient HTTP status."""
    def transient(error: BaseException) -> bool:
        return isinstance(error, Failure) and error.rule == "push" and bool(_TRANSIENT_PUSH.search(error.message))

    def say_retry(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        progress(f"  {error.message if isinstance(error, Failure) else error}; pushing {tag} again in "
                 f"{state.upcoming_sleep:.1f} s (attempt {state.attempt_number + 1} of {retry.attempts})")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retry.attempts),
        wait=tenacity.wait_exponential(multiplier=retry.first_wait, max=retry.max_wait),
        retry=tenacity.retry_if_exception(transient), before_sleep=say_retry, reraise=True)
    try:
        return retrying(engine.transfer.push_image, registry.name, tag, auth, progress, layer_status)
    except Failure as error:
        if transient(error):
            error.message += f" ({retry.attempts} attempts)"
            error.args = (error.message,)
        raise


def _verify(client: RegistryClient, registry: Registry, tag: str, digest: str) -> None:
    served = client.manifest_digest(tag)
    if served is None:
        raise Failure(f"{registry.ref(tag)} is missing right after its push", rule="push-verified",
                      hint="the registry lost the manifest (restarted without storage?); push again")
    if served != digest:
        raise Failure(f"{registry.ref(tag)} resolves to {served}, but the push produced {digest}",
                      rule="push-verified", hint="someone else pushed the same tag meanwhile; push again")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- published.json --------------------------------------------------------------------------------------

def record_published(path: Path, entries: list[Published]) -> None:
    """Merge entries into the file, replacing it atomically so readers never see half a file."""
    merged = read_published(path)
    for entry in entries:
        previous = merged.get(entry.tag)
        if previous is not None and previous.promotions and not entry.promotions:
            # A new push to staging must not forget the copies already promoted (prune protects them).
            entry = dataclasses.replace(entry, promotions=previous.promotions)
        merged[entry.tag] = entry
    write_published(path, merged)


def _missing_part(part: Path) -> ConfigError:
    if any(char in str(part) for char in "*?["):
        # The shell passes a pattern that matched nothing on as it is: no build job uploaded a part.
        return ConfigError(f"no published.json part matches {part}", rule="published-merge",
                           hint="no build job pushed a flavour; see the `image` jobs' push steps")
    return ConfigError("file not found", location=Location(str(part)), rule="published-merge",
                       hint="pass the published.json files the build jobs uploaded")


def write_published(path: Path, entries: Mapping[str, Published]) -> None:
    """Write published.json atomically (model.published.document): the one format push and merge both write."""
    diskio.write_text_atomic(path, published_document(dict(entries)), "published.json")


def merge_published_parts(parts: list[Path]) -> dict[str, Published]:
    """The union of several published.json files (one per CI build job), each read and checked like resolve
    reads one. A tag may appear in more than one part only with the same ref (registry@digest); anything else
    is a ConfigError naming both parts. Writes nothing: the caller writes the result once every part is good.
    """
    if not parts:
        raise ConfigError("no published.json part to merge", rule="published-merge",
                          hint="pass the parts the build jobs uploaded, e.g. parts/published-*/published.json")
    merged: dict[str, Published] = {}
    came_from: dict[str, Path] = {}
    for part in parts:
        if not os.path.lexists(part):  # read_published reads a missing file as "nothing pushed yet"
            raise _missing_part(part)
        for tag, entry in read_published(part).items():
            previous = merged.get(tag)
            if previous is not None and previous.ref != entry.ref:
                raise ConfigError(
                    f"flavour {tag} is {previous.ref} in {came_from[tag]} but {entry.ref} in {part}",
                    location=Location(str(part)), rule="published-merge",
                    hint="two build jobs pushed the same tag; keep the part of the run you mean to publish")
            merged.setdefault(tag, entry)
            came_from.setdefault(tag, part)
    if not merged:
        raise ConfigError(f"no flavour in {len(parts)} published.json part(s)", rule="published-merge",
                          hint="no build job pushed a flavour; see the `image` jobs' push steps")
    return merged


def push_all(flavours: list[Target], registry: Registry, published_path: Path, *,
             credentials: Credentials | None, retry: RetryPolicy | None = None,
             progress: Progress = lambda line: None,
             transfers: dict[str, Transfer] | None = None) -> list[Published]:
    """Push flavours one after another; each is recorded as soon as it is verified. Stops at the first failure.

    Every image is checked to be built from its flavour's current inputs before anything is pushed, so a
    missing or stale image fails the run up front instead of half-way.
    """
    for flavour in flavours:
        _built_labels(flavour, local_ref(flavour.tag))
        nightly_check.verify_image(flavour, local_ref(flavour.tag))  # a stale nightly is refused before any push
    client = RegistryClient(registry, credentials, retry=retry)
    done = []
    for flavour in flavours:
        entry = push_flavour(flavour, registry, client, credentials, progress, transfers)
        record_published(published_path, [entry])
        done.append(entry)
    return done
