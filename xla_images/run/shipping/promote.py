"""Promote tested images from one registry to another by digest: no rebuild, no pull into the local engine.

Everything goes over the registry HTTP API v2. For each flavour:

1. every tag of the flavour is resolved at the source, for all flavours before anything is written, so a missing
   flavour (or tags of one flavour that disagree) fails the run with nothing changed at the destination;
2. each blob (config and layers, of every child manifest of an index too) the destination lacks is
   cross-repository mounted when both repositories live on the same registry host
   (`POST /v2/<to>/blobs/uploads/?mount=<digest>&from=<repo>`: no bytes move), otherwise streamed from the
   source (`GET`) into an upload session at the destination (one `PUT` for a small blob, `PATCH` chunks then
   `PUT ?digest=` for a large one), bounded by its descriptor's size and checked against its size and digest
   before the upload is finished (a short, endless or other blob is refused; the source is read under a deadline
   of DEADLINE plus its size at 1 MiB/s);
3. child manifests are put by digest, then the flavour's manifest, byte for byte, under its canonical tag and
   then its aliases (an alias never names a manifest the destination lacks); the digest the destination serves
   for every tag must equal the source digest; the manifest is the one fetched by the digest the source's tags
   named (the client checks it hashes to it), so only the digest asked for is tagged and recorded;
4. published.json records the copy (the entry's `promotions`), written atomically.
"""
from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ...errors import Failure
from ...model.registry import Registry
from ...model.target import Target
from .publish import record_published
from ...model.published import Published, read_published
from .. import netread
from ..registry import RegistryClient, answers
from ..registry.upload import DEFAULT_CHUNK, BlobUpload, blob_exists

Progress = Callable[[str], None]


@dataclass
class Transfer:
    """What moved: blobs mounted (no bytes), streamed (bytes), or already at the destination."""

    mounted: int = 0
    copied: int = 0
    present: int = 0
    bytes_mounted: int = 0
    bytes_copied: int = 0
    manifests: int = 0

    def add(self, other: Transfer) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict[str, int]:
        return dict(vars(self))

    def __str__(self) -> str:
        return (f"{self.mounted} blob(s) mounted ({self.bytes_mounted} B), {self.copied} copied "
                f"({self.bytes_copied} B), {self.present} already there, {self.manifests} manifest(s) put")


@dataclass(frozen=True)
class SourceImage:
    flavour: Target
    digest: str
    manifest: bytes
    media_type: str


@dataclass(frozen=True)
class Promoted:
    tag: str
    tags: tuple[str, ...]
    source_ref: str
    destination_ref: str
    digest: str
    transfer: Transfer = field(default_factory=Transfer)


# --- the source ------------------------------------------------------------------------------------------

def find_at_source(flavours: list[Target], source: RegistryClient) -> list[SourceImage]:
    """Every tag of every flavour at the source, agreeing on one digest; a Failure naming all that is missing."""
    source.check_reachable()
    found, missing = [], []
    for flavour in flavours:
        digests = {tag: source.manifest_digest(tag) for tag in flavour.tags}
        absent = [tag for tag, digest in digests.items() if digest is None]
        if absent:
            missing.append(f"{flavour.tag} ({', '.join(absent)})")
            continue
        if len(set(digests.values())) > 1:
            listing = ", ".join(f"{tag}={digest}" for tag, digest in digests.items())
            raise Failure(f"the tags of {flavour.tag} point at different manifests in {source.registry}: {listing}",
                          rule="promote-source", hint=f"push {flavour.tag} to the source again, then promote")
        fetched = source.manifest_bytes(digests[flavour.tag] or "")
        if fetched is None:
            missing.append(flavour.tag)
            continue
        manifest, media_type, digest = fetched
        if digest != digests[flavour.tag]:  # manifest_bytes verified it; said again where the digest is chosen
            raise answers.other_digest(source.registry.host, f"GET manifest {digests[flavour.tag]}", digest,
                                       str(digests[flavour.tag]))
        found.append(SourceImage(flavour, digest, manifest, media_type))
    if missing:
        raise Failure(f"not in {source.registry}: {'; '.join(missing)}", rule="promote-source",
                      hint="push (and test) them there first; nothing was written to the destination")
    return found


# --- blobs -----------------------------------------------------------------------------------------------

def blobs_of(manifest: dict[str, Any], host: str = "the source") -> list[tuple[str, int]]:
    """(digest, size) of the config and every layer; foreign layers (with `urls`) live elsewhere: skipped.
    Digests and sizes are checked: they become URLs and byte counts."""
    blobs = []
    config = manifest.get("config")
    if config:
        if not isinstance(config, dict):
            raise answers.refuse(host, "a manifest", "a `config` that is not an object")
        blobs.append((answers.checked_digest(config.get("digest"), host, "a manifest's config"),
                      _size(config, host)))
    for layer in answers.blob_list(manifest, host):
        if not layer.get("urls"):
            blobs.append((str(layer["digest"]), _size(layer, host)))
    return blobs


def _size(descriptor: dict[str, Any], host: str) -> int:
    size = descriptor.get("size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise answers.refuse(host, "a manifest", "a size that is not a whole number")
    return size


class BlobCopier:
    """Copies blobs from one repository to another: mount on the same host, stream otherwise."""

    def __init__(self, source: RegistryClient, destination: RegistryClient, chunk_size: int = DEFAULT_CHUNK) -> None:
        self.source = source
        self.destination = destination
        self.chunk_size = chunk_size
        self.same_host = source.registry.host == destination.registry.host

    def copy(self, digest: str, size: int, transfer: Transfer) -> None:
        to_repo = self.destination.registry.repository
        if blob_exists(self.destination, digest):
            transfer.present += 1
            return
        if self.same_host:
            response = self.destination.request("POST", f"/v2/{to_repo}/blobs/uploads/",
                                                params={"mount": digest, "from": self.source.registry.repository})
            if response.status_code == 201:
                transfer.mounted += 1
                transfer.bytes_mounted += size
                return
            # 202: the registry would not mount (say, no pull right on the source) and opened an upload.
        else:
            response = None
        upload = BlobUpload(self.destination, "promote-blob", self.chunk_size).start(response)
        try:
            transfer.bytes_copied += self._stream(digest, size, upload)
        except BaseException:
            upload.cancel()
            raise
        transfer.copied += 1

    def _stream(self, digest: str, size: int, upload: BlobUpload) -> int:
        """The blob from the source into `upload`: at most `size` bytes read, then its size and digest checked."""
        source_repo = self.source.registry.repository
        what = f"read blob {digest} from {self.source.registry}"
        with self.source.exchange(what, self.source.deadline_for(size)):
            response = self.source.request("GET", f"/v2/{source_repo}/blobs/{digest}", stream=True)
            self.source.raise_for(response, what)
            if response.status_code != 200:
                response.close()
                raise Failure(f"could not {what}: HTTP {response.status_code}", rule="promote-blob")
            sha, read = hashlib.sha256(), 0
            for piece in netread.iter_body(response, size, host=f"registry {self.source.registry.host}", what=what,
                                           rule="promote-blob"):
                sha.update(piece)
                read += len(piece)
                upload.write(piece)
        if read != size:
            raise Failure(f"blob {digest} read from {self.source.registry} is {read} bytes, its manifest says {size}",
                          rule="promote-blob", hint="the source registry's storage is corrupt or the answer was cut; "
                                                    "nothing was tagged at the destination")
        if "sha256:" + sha.hexdigest() != digest:
            raise Failure(f"blob {digest} read from {self.source.registry} has another sha256", rule="promote-blob",
                          hint="the source registry's storage is corrupt; nothing was tagged at the destination")
        return upload.finish(digest)


# --- manifests -------------------------------------------------------------------------------------------

def put_manifest(client: RegistryClient, reference: str, manifest: bytes, media_type: str, digest: str) -> None:
    response = client.request("PUT", f"/v2/{client.registry.repository}/manifests/{reference}", data=manifest,
                              headers={"Content-Type": media_type})
    client.raise_for(response, f"PUT manifest {reference}")
    served = response.headers.get("Docker-Content-Digest")
    if served:
        served = answers.checked_digest(served, client.registry.host, f"PUT manifest {reference}")
    if served and served != digest:
        raise Failure(f"{client.registry.ref(reference)} was stored as {served}, the source is {digest}",
                      rule="promote-verified", hint="the destination rewrote the manifest; it cannot keep the digest")


def copy_image(image: SourceImage, copier: BlobCopier) -> Transfer:
    """Blobs, then child manifests (by digest), then the manifest under each tag; verify every tag's digest."""
    transfer = Transfer()
    destination = copier.destination
    host = copier.source.registry.host
    document = answers.json_object(image.manifest, host, "a manifest")
    if image.media_type in answers.INDEX_TYPES or "manifests" in document:
        children = document.get("manifests") or []
        if not isinstance(children, list) or not all(isinstance(child, dict) for child in children):
            raise answers.refuse(host, "an index", "`manifests` that is not a list of objects")
        for child in children:
            fetched = copier.source.manifest_bytes(answers.checked_digest(child.get("digest"), host, "an index"))
            if fetched is None:
                raise Failure(f"{image.flavour.tag}'s index names {child['digest']}, which the source lacks",
                              rule="promote-source")
            raw, media_type, digest = fetched
            for blob, size in blobs_of(answers.json_object(raw, host, "a manifest"), host):
                copier.copy(blob, size, transfer)
            put_manifest(destination, digest, raw, media_type, digest)
            transfer.manifests += 1
    else:
        for blob, size in blobs_of(document, host):
            copier.copy(blob, size, transfer)
    for tag in image.flavour.tags:
        put_manifest(destination, tag, image.manifest, image.media_type, image.digest)
        transfer.manifests += 1
        served = destination.manifest_digest(tag)
        if served != image.digest:
            raise Failure(f"{destination.registry.ref(tag)} resolves to {served}, the source digest is "
                          f"{image.digest}", rule="promote-verified", hint="someone pushed the tag meanwhile; "
                                                                           "promote again")
    return transfer


# --- the command -----------------------------------------------------------------------------------------

def promote(flavours: list[Target], source: RegistryClient, destination: RegistryClient, published_path: Path, *,
            chunk_size: int = DEFAULT_CHUNK, progress: Progress = lambda line: None) -> list[Promoted]:
    """Promote `flavours`; each is recorded in published.json as soon as its every tag is verified."""
    if source.registry.name == destination.registry.name:
        raise Failure(f"--from and --to are both {source.registry}", rule="promote-source",
                      hint="promote copies between two repositories or registries")
    images = find_at_source(flavours, source)
    destination.check_reachable()
    copier = BlobCopier(source, destination, chunk_size)
    done = []
    for image in images:
        how = "mounting" if copier.same_host else "streaming"
        progress(f"{image.flavour.tag}: {source.registry.digest_ref(image.digest)} -> {destination.registry} "
                 f"({how} blobs)")
        transfer = copy_image(image, copier)
        promoted = Promoted(image.flavour.tag, image.flavour.tags, source.registry.digest_ref(image.digest),
                            destination.registry.digest_ref(image.digest), image.digest, transfer)
        record_promotion(published_path, image, promoted, source, destination.registry)
        progress(f"{image.flavour.tag}: verified {promoted.destination_ref}: {transfer}")
        done.append(promoted)
    return done


def record_promotion(path: Path, image: SourceImage, promoted: Promoted, source: RegistryClient,
                     destination: Registry) -> None:
    copy = {"registry": destination.name, "digest": promoted.digest, "ref": promoted.destination_ref,
            "from": promoted.source_ref, "promoted_at": _now()}
    entry = read_published(path).get(image.flavour.tag)
    if entry is None:
        # Never pushed from here: the entry is the copy itself, with the labels the image's config holds.
        entry = Published(image.flavour.tag, image.flavour.tags, destination.name, promoted.digest,
                          _labels(image, source), image.flavour.to_json(), copy["promoted_at"])
    others = tuple(item for item in entry.promotions if item.get("registry") != destination.name)
    record_published(path, [replace(entry, promotions=others + (copy,))])


def _labels(image: SourceImage, source: RegistryClient) -> dict[str, str]:
    document = answers.json_object(image.manifest, source.registry.host, "a manifest")
    config = document.get("config")
    if not config:
        return {}  # an index has no config of its own
    labels = (source.blob_json(str(config.get("digest"))).get("config") or {}).get("Labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(value, str) for value in labels.values()):
        raise answers.refuse(source.registry.host, "the image config", "`Labels` that are not strings")
    return dict(labels)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
