"""Push flavour images to a registry and prove every tag and alias resolves to the pushed digest.

The order is what keeps a registry consistent when anything fails half-way: the canonical tag is pushed and
verified first (HTTP API v2: the manifest digest the registry serves for the tag), and only then each alias,
so an alias never names a manifest the registry does not hold. published.json gains a flavour only once all
its tags are verified; it is rewritten atomically, merged with what it held.

Registry access (trust, credentials, token auth, the API client) is run.registry's: the engine gets the
same credentials for the push as the toolkit's own verifying calls (`Credentials.auth_config`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import tenacity

from ... import diskio
from ...errors import ConfigError, Failure, Location
from ...model.compression import LAYER_MEDIA_TYPES, Compression
from ...model.published import Published, read_published
from ...model.published import document as published_document
from ...model.registry import Registry
from ...model.target import Target
from ...names import FLAVOUR_ID_LABEL, local_ref
from .. import engine, registry as registries
from ..checking import nightly_check
from . import zstd_push
from ..registry import RETRIED_STATUSES, Credentials, RegistryClient, RetryPolicy, redacting

# The classic store's dockerd retries a failed layer upload itself (5 times, ~50 s), but not the manifest PUT that
# ends a push: such an answer there is worth one more push (layers already up are skipped). Its connection errors
# are not retried here: they come out of dockerd's own layer retries, which already took their time.
# The containerd store's push words answers otherwise, asks for the tag's manifest first (HEAD), and does not retry
# a layer upload cut by a dropped connection (`failed to do request: Put ...`): those are pushed again here.
_STATUSES = "|".join(map(str, RETRIED_STATUSES))
_TRANSIENT_PUSH = re.compile(rf"unexpected HTTP status: (?:{_STATUSES})\b"
                             rf"|unexpected status from [A-Z]+ request to \S+: (?:{_STATUSES})\b"
                             r"|failed to do request: (?:Patch|Put|Post) \"")


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
        # The classic store names a layer by its diff id, the containerd store by its compressed digest.
        kind = status.get(diff_id.removeprefix("sha256:")[:12]) or status.get(blob["digest"][7:19], "present")
        sizes[kind][0] += int(blob.get("size") or 0)
        sizes[kind][1] += 1
    return Transfer(sizes["uploaded"][0], sizes["present"][0], sizes["uploaded"][1], sizes["present"][1])


def push_flavour(flavour: Target, registry: Registry, client: RegistryClient,
                 credentials: Credentials | None, progress: Progress = lambda line: None,
                 transfers: dict[str, Transfer] | None = None,
                 compression: Compression = Compression("gzip", None)) -> Published:
    """Push the flavour's tag, verify it, then each alias; return the verified record.

    The engine pushes gzip layers, and any layers of its containerd image store (they are stored compressed as
    the build exported them, and checked against `compression` once pushed); zstd layers of the classic store are
    the toolkit's push (run.shipping.zstd_push), in the same order. Reports the bytes uploaded vs already present (and
    records them in `transfers`, when given, by tag).
    """
    image = local_ref(flavour.tag)
    with redacting(credentials):
        labels = _built_labels(flavour, image)
        client.check_reachable()
        containerd = engine.connection.image_store() == "containerd"
        if not (compression.by_engine or containerd):
            return _push_zstd(flavour, image, labels, registry, client, compression, progress, transfers)
        auth = credentials.auth_config(registry.host) if credentials else None
        progress(f"{flavour.tag}: pushing {image} to {registry.ref(flavour.tag)}")
        status: dict[str, str] = {}
        digest = _push_tag(image, registry, flavour.tag, auth, progress, client.retry, status)
        _verify(client, registry, flavour.tag, digest)
        manifest = client.manifest(digest) if status or containerd else {}
        if containerd:  # the classic store's push can only write gzip
            check_layer_compression(manifest, compression, registry.ref(flavour.tag))
        if status:  # the engine reported per layer (it always does; a fake in unit tests may not)
            transfer = transfer_of(engine.images.image_layers(image), manifest, status)
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
    return Published(flavour.tag, flavour.tags, registry.name, digest, labels, flavour.to_json(), now())


def check_layer_compression(manifest: dict[str, Any], compression: Compression, ref: str) -> None:
    """A Failure, before any alias is pushed, when the engine pushed layers of another compression than the site's:
    the containerd store pushes what it holds (an image built with another setting, or pulled)."""
    wanted = LAYER_MEDIA_TYPES[compression.format]
    found = sorted({str(blob.get("mediaType")) for blob in manifest.get("layers") or []} - set(wanted))
    if found:
        raise Failure(f"{ref} was pushed with layers of type {', '.join(found)}, but the site's compression is "
                      f"{compression.describe()} ({wanted[-1]}); no alias was pushed", rule="push-compression",
                      hint="the engine holds this image compressed otherwise (built with another setting, or "
                           "pulled): rebuild it with `build.py build --force`, then push again")


def _push_zstd(flavour: Target, image: str, labels: dict[str, str], registry: Registry, client: RegistryClient,
               compression: Compression, progress: Progress, transfers: dict[str, Transfer] | None) -> Published:
    progress(f"{flavour.tag}: pushing {image} to {registry.ref(flavour.tag)} ({compression.describe()} layers)")
    with _push_failed(registry.ref(flavour.tag)):
        pushed = _zstd_retrying(image, client, compression, flavour.tag, progress)
    transfer = Transfer(sum(layer.size for layer in pushed.layers if layer.uploaded),
                        sum(layer.size for layer in pushed.layers if not layer.uploaded),
                        sum(1 for layer in pushed.layers if layer.uploaded),
                        sum(1 for layer in pushed.layers if not layer.uploaded))
    if transfers is not None:
        transfers[flavour.tag] = transfer
    progress(f"{flavour.tag}: {transfer.describe()}")
    progress(f"{flavour.tag}: verified {registry.digest_ref(pushed.digest)}")
    for alias in flavour.aliases:
        # The same manifest bytes under another tag: nothing is compressed or uploaded again.
        with _push_failed(registry.ref(alias)):
            zstd_push.put_manifest(client, alias, pushed.manifest, pushed.digest)
        progress(f"{flavour.tag}: alias {registry.ref(alias)} verified")
    return Published(flavour.tag, flavour.tags, registry.name, pushed.digest, labels, flavour.to_json(), now())


def _zstd_retrying(image: str, client: RegistryClient, compression: Compression, tag: str,
                   progress: Progress) -> zstd_push.ZstdPush:
    """push_zstd, pushed again when the registry answered an upload unexpectedly (a chunk cut by a dropped link
    comes back as 416 or 400): what it already holds is skipped, so only the cut layer goes again. A registry that
    stopped answering has had the client's own retries already and fails at once."""
    def say_retry(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        progress(f"  {error.message if isinstance(error, Failure) else error}; pushing {tag} again in "
                 f"{state.upcoming_sleep:.1f} s (attempt {state.attempt_number + 1} of {client.retry.attempts})")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(client.retry.attempts),
        wait=tenacity.wait_exponential(multiplier=client.retry.first_wait, max=client.retry.max_wait),
        retry=tenacity.retry_if_exception(lambda error: isinstance(error, Failure) and error.rule == "push"),
        before_sleep=say_retry, reraise=True)
    return retrying(zstd_push.push_zstd, image, client, compression, [tag], progress)


@contextlib.contextmanager
def _push_failed(ref: str) -> Iterator[None]:
    """Name the tag being pushed in any failure, as the engine's push does (`push of REF failed: ...`)."""
    try:
        yield
    except Failure as error:
        error.message = f"push of {ref} failed: {error.message}"
        error.args = (error.message,)
        raise


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


def now() -> str:
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
             retry: RetryPolicy | None = None,
             progress: Progress = lambda line: None,
             transfers: dict[str, Transfer] | None = None,
             compression: Compression = Compression("gzip", None)) -> list[Published]:
    """Push flavours one after another; each is recorded as soon as it is verified. Stops at the first failure.

    Every image is checked to be built from its flavour's current inputs before anything is pushed, so a
    missing or stale image fails the run up front instead of half-way. The engine pushes with the very
    credentials the client verifies with (run.registry.connect finds them).
    """
    for flavour in flavours:
        _built_labels(flavour, local_ref(flavour.tag))
        nightly_check.verify_image(flavour, local_ref(flavour.tag))  # a stale nightly is refused before any push
    client = registries.connect(registry, registries.WRITE, named=(registry.host,), retry=retry)
    done = []
    for flavour in flavours:
        entry = push_flavour(flavour, registry, client, client.credentials, progress, transfers, compression)
        record_published(published_path, [entry])
        done.append(entry)
    return done
