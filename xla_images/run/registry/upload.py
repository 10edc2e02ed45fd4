"""Blob uploads through the HTTP API v2: open a session, send chunks, close it with the digest.

One implementation for everything the toolkit uploads itself: promote's copies between registries and the zstd
push's layers. A blob is sent in `PATCH` chunks of bounded size (memory stays flat for 5-8 GB images) whose
`Content-Range` the registry checks, and the last piece goes with the closing `PUT ?digest=`, so a small blob
(a config) is one request. The registry checks the digest itself: a blob that arrived otherwise is refused.

A `Location` on another host (storage behind the registry) gets the chunks but no credential: the client's
policy sends Authorization only to the registry's own origin and answers no challenge from elsewhere. A
Location whose text could name two hosts (a backslash in its authority, ...) is refused under `url-ambiguous`.
"""
from __future__ import annotations

from typing import Any, Iterable

from ...errors import Failure
from .. import weburl
from .client import RegistryClient

DEFAULT_CHUNK = 16 << 20  # bytes per PATCH


def blob_exists(client: RegistryClient, digest: str) -> bool:
    """HEAD the blob in the client's repository: a registry deduplicates by digest, so a present blob is skipped."""
    response = client.request("HEAD", f"/v2/{client.registry.repository}/blobs/{digest}")
    response.close()
    if response.status_code == 404:
        return False
    client.raise_for(response, f"HEAD blob {digest}")
    return response.status_code == 200


class BlobUpload:
    """One upload session in the client's repository; `rule` names the command's errors (push, promote-blob)."""

    def __init__(self, client: RegistryClient, rule: str, chunk_size: int | None = None) -> None:
        self.client = client
        self.rule = rule
        self.chunk_size = chunk_size or DEFAULT_CHUNK
        self.location = ""
        self.offset = 0
        self._pending = bytearray()  # grows in place: no quadratic copying of a 16 MB chunk

    def start(self, response: Any | None = None) -> "BlobUpload":
        """Open the session (or adopt the 202 answer of a mount the registry declined, which opened one)."""
        if response is None:
            response = self.client.request("POST", f"/v2/{self.client.registry.repository}/blobs/uploads/")
        self._expect(response, 202, "start an upload")
        self.location = self._location(response)
        return self

    def write(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= self.chunk_size:
            self._patch(bytes(self._pending))
            self._pending.clear()

    def finish(self, digest: str, *, data_in_put: bool = True) -> int:
        """Close the session with `PUT ?digest=`; return the blob's size. What is left goes with the PUT, or (with
        data_in_put=False) in a last PATCH before an empty PUT, the way the engine's own push ends a layer."""
        if not data_in_put and self._pending:
            self._patch(bytes(self._pending))
            self._pending.clear()
        done = self.client.request("PUT", self.location, params={"digest": digest},
                                   headers={"Content-Type": "application/octet-stream"}, data=bytes(self._pending))
        self._expect(done, 201, f"finish the upload of {digest}")
        size = self.offset + len(self._pending)
        self._pending.clear()
        return size

    def cancel(self) -> None:
        """End an unfinished session (best effort: a registry also expires it), so no partial upload lingers."""
        if self.location:
            try:
                self.client.request("DELETE", self.location, once=True).close()
            except Failure:
                pass

    def _patch(self, data: bytes) -> None:
        response = self.client.request(
            "PATCH", self.location, data=data,
            headers={"Content-Type": "application/octet-stream",
                     "Content-Range": f"{self.offset}-{self.offset + len(data) - 1}"})
        self._expect(response, 202, "upload a chunk")
        self.offset += len(data)
        self.location = self._location(response)

    def _location(self, response: Any) -> str:
        location = response.headers.get("Location")
        if not location:
            raise Failure(f"{self.client.registry.host} opened an upload without a Location", rule=self.rule)
        # Relative to the URL that answered; read strictly (policy, rule 5): a Location that could name two hosts
        # is refused here, before the chunk or the credentials it would carry are sent anywhere.
        answered = getattr(response, "url", None)
        base = answered if isinstance(answered, str) and "://" in answered else self.client.base_url + "/"
        who = f"registry {self.client.registry.host}"
        return weburl.parse(base, who=who).join(str(location), who=who).text

    def _expect(self, response: Any, status: int, what: str) -> None:
        if response.status_code in (401, 403):
            self.client.raise_for(response, what)  # an auth failure names the credential source
        if response.status_code != status:
            # A session the registry lost (404) or a chunk it did not take whole (400, 416) after a cut link: the
            # command's rule, so a caller that can start the blob again (the zstd push) knows it may.
            response.close()
            raise Failure(f"could not {what} at {self.client.registry.host}: HTTP {response.status_code}",
                          rule=self.rule)


def upload_bytes(client: RegistryClient, digest: str, pieces: Iterable[bytes], rule: str) -> int:
    """Upload a blob whose digest is known up front (a config, a copied blob); return its size."""
    upload = BlobUpload(client, rule).start()
    try:
        for piece in pieces:
            upload.write(piece)
        return upload.finish(digest)
    except BaseException:
        upload.cancel()
        raise

