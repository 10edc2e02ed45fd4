"""A fake Docker registry (the distribution API v2 subset the unit tests need) on a recording host.

It keeps what it is given: manifests by tag and digest, blobs by digest, uploads (POST, PATCH, PUT with a
Location), tag lists and the catalog. On top: Basic or Bearer auth (Bearer with its own token endpoint at
/token, which wants the Basic credentials and grants tokens `tok-0`, `tok-1`, ... for `lifetime` seconds),
redirects of blob and manifest reads to another host (storage behind signed URLs), and scripted faults that
win over everything else (a status, a Truncated body, a Stalled answer), matched by method and path pattern.
Every request, the token requests included, is recorded in `seen` like any Host's."""
from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from support.host import Answer, Host, Reply, Seen

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
NAME = r"(?P<name>[a-z0-9._/-]+?)"
REFERENCE = r"(?P<ref>[A-Za-z0-9_.:-]+)"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def gzipped(data: bytes) -> bytes:
    """`data` as a gzip layer blob (mtime 0, so the digest is the same every run)."""
    return gzip.compress(data, mtime=0)


def tar_of(members: dict[str, bytes]) -> bytes:
    """An uncompressed tar holding `members` (name -> bytes), in order: a layer, or a `docker save` archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zstd_compressed(data: bytes) -> bytes:
    """`data` as a zstd layer blob (the zstandard package is a pinned dependency of the product)."""
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


@dataclass
class Fault:
    method: str  # "" for any
    pattern: str  # a regular expression searched in the path
    reply: Reply
    times: int | None = None  # how many requests it answers; None for all


@dataclass
class Repository:
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # digest -> media type, body


class FakeRegistry(Host):
    """A registry on `address`; `auth` is None, "basic" or "bearer" (user `user`, password `password`)."""

    def __init__(self, address: str = "127.0.0.1", *, auth: str | None = None, user: str = "user",
                 password: str = "pw", service: str = "reg", lifetime: int = 300, **kwargs: object) -> None:
        super().__init__(address, **kwargs)  # type: ignore[arg-type]
        if auth not in (None, "basic", "bearer"):
            raise ValueError(f"auth is None, 'basic' or 'bearer', not {auth!r}")
        self.auth, self.service, self.lifetime = auth, service, lifetime
        self.basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.tokens: list[str] = []  # granted, in order; the last one is the valid one
        self.repositories: dict[str, Repository] = {}
        self.blobs: dict[str, bytes] = {}
        self.uploads: dict[str, bytes] = {}  # upload id -> bytes so far
        self.faults: list[Fault] = []
        self.redirect_reads_to: str | None = None  # a base URL: blob and manifest GETs answer 307 there

    # --- what it holds ----------------------------------------------------------------------------------

    def put_manifest(self, name: str, tag: str | None, body: bytes, media_type: str = MANIFEST_TYPE) -> str:
        repository = self.repositories.setdefault(name, Repository())
        digest = digest_of(body)
        repository.manifests[digest] = (media_type, body)
        if tag is not None:
            repository.tags[tag] = digest
        return digest

    def put_blob(self, data: bytes) -> str:
        self.blobs[digest_of(data)] = data
        return digest_of(data)

    def fault(self, method: str, pattern: str, reply: Reply, times: int | None = None) -> None:
        """Answer requests of `method` ("" for any) whose path matches `pattern` with `reply`, before anything else."""
        self.faults.append(Fault(method, pattern, reply, times))

    # --- answering --------------------------------------------------------------------------------------

    def answer(self, seen: Seen) -> Reply:
        path = urlsplit(seen.path).path
        for fault in self.faults:
            if fault.method in ("", seen.method) and re.search(fault.pattern, path) and fault.times != 0:
                if fault.times is not None:
                    fault.times -= 1
                return fault.reply
        if path == "/token" and self.auth == "bearer":
            return self._token(seen)
        if not self._allowed(seen):
            return self._challenge()
        return self._api(seen, path)

    def _allowed(self, seen: Seen) -> bool:
        if self.auth == "basic":
            return seen.authorization == self.basic
        if self.auth == "bearer":
            return bool(self.tokens) and seen.authorization == f"Bearer {self.tokens[-1]}"
        return True

    def _challenge(self) -> Answer:
        if self.auth == "basic":
            return 401, {"WWW-Authenticate": 'Basic realm="fake"'}, b""
        realm = f"{self.url}/token"
        return 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="{self.service}",scope="x"'}, b""

    def _token(self, seen: Seen) -> Answer:
        if seen.authorization != self.basic:
            return 401, {}, b"{}"
        self.tokens.append(f"tok-{len(self.tokens)}")
        return 200, {"Content-Type": "application/json"}, \
            json.dumps({"token": self.tokens[-1], "expires_in": self.lifetime}).encode()

    def _api(self, seen: Seen, path: str) -> Answer:
        if path == "/v2/":
            return 200, {"Docker-Distribution-API-Version": "registry/2.0"}, b"{}"
        if path == "/v2/_catalog":
            return _json({"repositories": sorted(self.repositories)})
        for pattern, handler in ((rf"/v2/{NAME}/tags/list", self._tags), (rf"/v2/{NAME}/manifests/{REFERENCE}",
                                 self._manifest), (rf"/v2/{NAME}/blobs/uploads/(?P<ref>[^/]*)", self._upload),
                                 (rf"/v2/{NAME}/blobs/{REFERENCE}", self._blob)):
            match = re.fullmatch(pattern, path)
            if match:
                return handler(seen, match.group("name"), match.groupdict().get("ref") or "")
        return _error(404, "NAME_UNKNOWN")

    def _tags(self, seen: Seen, name: str, _: str) -> Answer:
        repository = self.repositories.get(name)
        if repository is None:
            return _error(404, "NAME_UNKNOWN")
        return _json({"name": name, "tags": sorted(repository.tags)})

    def _manifest(self, seen: Seen, name: str, ref: str) -> Answer:
        repository = self.repositories.setdefault(name, Repository())
        digest = ref if ref.startswith("sha256:") else repository.tags.get(ref)
        if seen.method == "PUT":
            media_type = seen.headers.get("content-type", MANIFEST_TYPE)
            digest = self.put_manifest(name, None if ref.startswith("sha256:") else ref, seen.body, media_type)
            return 201, {"Docker-Content-Digest": digest, "Location": f"/v2/{name}/manifests/{digest}"}, b""
        if digest is None or digest not in repository.manifests:
            return _error(404, "MANIFEST_UNKNOWN")
        if seen.method == "DELETE":
            del repository.manifests[digest]
            repository.tags = {tag: held for tag, held in repository.tags.items() if held != digest}
            return 202, {}, b""
        if seen.method == "GET" and self.redirect_reads_to:
            return 307, {"Location": f"{self.redirect_reads_to}{seen.path}"}, b""
        media_type, body = repository.manifests[digest]
        return 200, {"Docker-Content-Digest": digest, "Content-Type": media_type}, body

    def _blob(self, seen: Seen, name: str, digest: str) -> Answer:
        if digest not in self.blobs:
            return _error(404, "BLOB_UNKNOWN")
        if seen.method == "GET" and self.redirect_reads_to:
            return 307, {"Location": f"{self.redirect_reads_to}{seen.path}"}, b""
        return 200, {"Docker-Content-Digest": digest, "Content-Type": "application/octet-stream"}, self.blobs[digest]

    def _upload(self, seen: Seen, name: str, upload: str) -> Answer:
        if seen.method == "POST":
            upload = str(len(self.uploads))
            self.uploads[upload] = b""
        elif upload not in self.uploads:
            return _error(404, "BLOB_UPLOAD_UNKNOWN")
        self.uploads[upload] += seen.body if seen.method in ("PATCH", "PUT") else b""
        if seen.method != "PUT":
            return 202, {"Location": f"/v2/{name}/blobs/uploads/{upload}", "Range": "0-0"}, b""
        wanted = parse_qs(urlsplit(seen.path).query).get("digest", [""])[0]
        data = self.uploads.pop(upload)
        if digest_of(data) != wanted:
            return _error(400, "DIGEST_INVALID")
        self.blobs[wanted] = data
        return 201, {"Docker-Content-Digest": wanted, "Location": f"/v2/{name}/blobs/{wanted}"}, b""


def _json(value: object) -> Answer:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


def _error(status: int, code: str) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps({"errors": [{"code": code}]}).encode()
