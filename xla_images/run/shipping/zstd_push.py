"""Push an image with zstd layers: the toolkit compresses each layer on every core and uploads it through the
registry API, then puts an OCI manifest under the tag and each alias.

Why not the engine: dockerd's classic image store keeps layers uncompressed and its push compresses them with gzip
on one core (~105 s for the 7.65 GB torch_xla 2.9 image here), and it cannot write zstd at all. `zstd -T0` on the
same layers takes a fraction of that, and engines from Docker 23 / containerd 1.5 pull zstd faster than gzip.

How, for one image:
1. Each layer's compressed digest is remembered by diff id, zstd version and level ($XLA_IMAGES_CACHE): a layer the
   registry already holds (a re-push, an alias, a flavour sharing its lower layers) is neither exported nor sent.
2. Otherwise the engine exports the image (`docker save`, a stream: never on disk); each missing layer's tar goes
   through `zstd` into a chunked upload. Its sha256 is checked against the diff id the engine reported, so a layer
   that is not what the image says never reaches the registry; the registry checks the compressed digest.
3. The config blob is the image's own config (its digest is the image id, so a pull gives the same image id).
4. The manifest is put under the tag, verified by digest, and only then under each alias (push's order rule).
The same image, zstd version and level give the same manifest digest on any machine: zstd's multi-threaded output
does not depend on the number of threads.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

from ... import diskio
from ...cache import cache_dir
from ...errors import Failure, XlaImagesError
from ...model.compression import OCI_CONFIG, OCI_MANIFEST, Compression
from .. import engine
from ..registry import RegistryClient
from ..registry.upload import BlobUpload, upload_bytes

Progress = Callable[[str], None]
READ_SIZE = 4 << 20  # bytes per read of the export: tarfile's stream mode reads 10 KB at a time otherwise
MAX_CONFIG = 16 << 20  # an image config is a few KB; a save member named like one but larger is not one
ZSTD_TIMEOUT = 30  # seconds for `zstd --version`
_ZSTD_VERSION = re.compile(r"v(\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class Layer:
    """One pushed layer: its diff id (uncompressed), compressed digest and size, and whether it was sent now."""

    diff_id: str
    digest: str
    size: int
    uploaded: bool


@dataclass(frozen=True)
class ZstdPush:
    """What `push_zstd` made: the manifest (bytes and digest) and each layer, bottom first."""

    digest: str
    manifest: bytes
    layers: tuple[Layer, ...]


def zstd_version() -> str:
    """The installed zstd's version: it is part of every cached digest (another version compresses otherwise)."""
    try:
        done = subprocess.run(["zstd", "--version"], capture_output=True, text=True, timeout=ZSTD_TIMEOUT)
    except FileNotFoundError:
        raise Failure("zstd is not installed: it compresses the layers of a zstd push", rule="push-zstd",
                      hint="`ci/engine.sh install` installs it (Debian package zstd), or set compression.format=gzip"
                      ) from None
    except subprocess.TimeoutExpired:
        raise Failure("`zstd --version` did not answer", rule="push-zstd") from None
    found = _ZSTD_VERSION.search(done.stdout)
    if done.returncode != 0 or not found:
        raise Failure(f"`zstd --version` answered {done.stdout.strip()[:80]!r}", rule="push-zstd")
    return found.group(1)


class DigestCache:
    """diff id → (compressed digest, size) for one zstd version and level, one small JSON file per layer."""

    def __init__(self, compression: Compression, version: str) -> None:
        self.folder = cache_dir() / "compressed-layers" / f"zstd-{version}-{compression.level}"

    def get(self, diff_id: str) -> tuple[str, int] | None:
        try:
            data = json.loads((self.folder / f"{diff_id.removeprefix('sha256:')}.json").read_text()[:4096])
            digest, size = data["digest"], data["size"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest) and isinstance(size, int)):
            return None
        return digest, size

    def put(self, diff_id: str, digest: str, size: int) -> None:
        try:
            diskio.write_text_atomic(self.folder / f"{diff_id.removeprefix('sha256:')}.json",
                                     json.dumps({"digest": digest, "size": size}), "a compressed-layer cache entry",
                                     root=cache_dir())
        except XlaImagesError:
            pass  # a cache that cannot be written costs the next push one export


def push_zstd(image: str, client: RegistryClient, compression: Compression, tags: list[str],
              progress: Progress = lambda line: None) -> ZstdPush:
    """Push `image` under `tags` (the first is canonical) with zstd layers; return the verified manifest."""
    attrs = engine.images.image_inspect(image)
    if attrs is None:
        raise Failure(f"image {image} is not on this engine", rule="image-exists")
    diff_ids = list((attrs.get("RootFS") or {}).get("Layers") or [])
    config_digest = str(attrs["Id"])
    cache = DigestCache(compression, zstd_version())
    known = _present_layers(client, cache, diff_ids)
    config_size = _blob_size(client, config_digest)
    missing = [diff_id for diff_id in dict.fromkeys(diff_ids) if diff_id not in known]
    made: dict[str, Layer] = {}
    if missing or config_size is None:
        progress(f"  exporting {image}: {len(missing)} layer(s) to compress with zstd level {compression.level}")
        made, config = _export_and_upload(image, client, compression, set(missing), config_digest, cache, progress)
        if config_size is None:
            config_size = upload_bytes(client, config_digest, [config], rule="push")
    layers = tuple(made.get(diff_id) or known[diff_id] for diff_id in diff_ids)
    manifest = manifest_bytes(config_digest, config_size, layers, compression)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    for tag in tags:
        put_manifest(client, tag, manifest, digest)
    return ZstdPush(digest, manifest, layers)


def manifest_bytes(config_digest: str, config_size: int, layers: tuple[Layer, ...], compression: Compression) -> bytes:
    """The OCI image manifest, serialized the same way every time (its digest is the image's name)."""
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": compression.layer_media_type, "digest": layer.digest, "size": layer.size}
                   for layer in layers],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def _present_layers(client: RegistryClient, cache: DigestCache, diff_ids: list[str]) -> dict[str, Layer]:
    """The layers whose compressed digest is remembered and which the registry holds: nothing to send."""
    present: dict[str, Layer] = {}
    for diff_id in dict.fromkeys(diff_ids):
        remembered = cache.get(diff_id)
        if remembered is None:
            continue
        size = _blob_size(client, remembered[0])
        if size == remembered[1]:
            present[diff_id] = Layer(diff_id, remembered[0], remembered[1], uploaded=False)
    return present


def _blob_size(client: RegistryClient, digest: str) -> int | None:
    response = client.request("HEAD", f"/v2/{client.registry.repository}/blobs/{digest}")
    response.close()
    if response.status_code == 404:
        return None
    client.raise_for(response, f"HEAD blob {digest}")
    length = response.headers.get("Content-Length", "")
    return int(length) if response.status_code == 200 and length.isdigit() else None


def _export_and_upload(image: str, client: RegistryClient, compression: Compression, missing: set[str],
                       config_digest: str, cache: DigestCache, progress: Progress) -> tuple[dict[str, Layer], bytes]:
    """Read the engine's export once: compress and upload each missing layer, keep the config's bytes.
    Each layer is remembered as soon as the registry has it, so a push cut later does not send it again."""
    made: dict[str, Layer] = {}
    config: bytes | None = None
    stream = engine.images.ChunkReader(engine.images.save_image_stream(image))
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=READ_SIZE) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                name = member.name.rsplit("/", 1)[-1]
                key = "sha256:" + name if member.name.startswith("blobs/sha256/") else ""
                if (key in missing and key not in made) or member.name.endswith("/layer.tar"):
                    layer = _compress_and_upload(archive.extractfile(member), client, compression, progress)
                    if key and layer.diff_id != key:
                        raise Failure(f"the engine exported layer {key[7:19]} with other content (sha256 "
                                      f"{layer.diff_id[7:19]}): nothing was tagged", rule="push-zstd",
                                      hint="the engine's layer store is damaged; rebuild the image")
                    if layer.diff_id in missing:
                        made[layer.diff_id] = layer
                        cache.put(layer.diff_id, layer.digest, layer.size)
                elif member.size <= MAX_CONFIG and config_digest in (key, "sha256:" + name.removesuffix(".json")):
                    data = archive.extractfile(member).read()
                    if "sha256:" + hashlib.sha256(data).hexdigest() == config_digest:
                        config = data
    except tarfile.TarError as error:
        raise Failure(f"the engine's export of {image} is not a tar archive ({error})", rule="push-zstd",
                      hint="push again; if it persists, check the engine's log") from None
    finally:
        stream.close()
    lacking = sorted(missing - set(made))
    if lacking or config is None:
        what = f"layer(s) {', '.join(d[7:19] for d in lacking)}" if lacking else "the image config"
        raise Failure(f"the engine's export of {image} lacks {what}", rule="push-zstd",
                      hint="the image changed during the push; push again")
    return made, config


def _compress_and_upload(source: BinaryIO | None, client: RegistryClient, compression: Compression,
                         progress: Progress) -> Layer:
    """Pipe one layer tar through `zstd -T0` into a chunked upload; hash both sides on the way."""
    if source is None:
        raise Failure("the engine's export has a layer that cannot be read", rule="push-zstd")
    command = ["zstd", "-q", "-c", f"-{compression.level}", "-T0", "--no-progress"]
    # A session of its own: a terminal's Ctrl-C reaches the toolkit, which stops zstd itself and cleans up.
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    feeder = _Feeder(source, process.stdin)
    upload = BlobUpload(client, "push")
    compressed = hashlib.sha256()
    try:
        upload.start()
        feeder.start()
        assert process.stdout is not None
        while piece := process.stdout.read(1 << 20):
            compressed.update(piece)
            upload.write(piece)
        feeder.join()
        if process.wait() != 0:
            error = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
            raise Failure(f"zstd failed with exit code {process.returncode}: {error[:300]}", rule="push-zstd")
        if feeder.error is not None:
            raise feeder.error
        digest = "sha256:" + compressed.hexdigest()
        size = upload.finish(digest, data_in_put=False)
    except BaseException:
        process.kill()
        if feeder.ident is not None:
            feeder.join()
        upload.cancel()
        raise
    finally:
        process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    progress(f"  {feeder.diff_id[7:19]}: {feeder.read / 1e6:.1f} MB -> {size / 1e6:.1f} MB zstd, uploaded")
    return Layer(feeder.diff_id, digest, size, uploaded=True)


class _Feeder(threading.Thread):
    """Writes the layer into zstd's stdin (and hashes it) while the caller reads zstd's stdout: no deadlock."""

    def __init__(self, source: BinaryIO, sink: Any) -> None:
        super().__init__(daemon=True)
        self.source, self.sink = source, sink
        self.sha = hashlib.sha256()
        self.read = 0
        self.error: BaseException | None = None

    @property
    def diff_id(self) -> str:
        return "sha256:" + self.sha.hexdigest()

    def run(self) -> None:
        try:
            while piece := self.source.read(READ_SIZE):
                self.sha.update(piece)
                self.read += len(piece)
                self.sink.write(piece)
        except BrokenPipeError:
            self.error = Failure("zstd stopped reading the layer", rule="push-zstd")
        except BaseException as error:  # delivered to the caller's thread, which raises it
            self.error = error
        finally:
            try:
                self.sink.close()
            except OSError:
                pass


def put_manifest(client: RegistryClient, tag: str, manifest: bytes, digest: str) -> None:
    """Put the manifest under `tag` and verify the registry serves exactly that digest for it."""
    response = client.request("PUT", f"/v2/{client.registry.repository}/manifests/{tag}", data=manifest,
                              headers={"Content-Type": OCI_MANIFEST})
    client.raise_for(response, f"PUT manifest {tag}")
    if response.status_code != 201:
        raise Failure(f"{client.registry.ref(tag)}: the registry answered HTTP {response.status_code} to the manifest",
                      rule="push")
    served = client.manifest_digest(tag)
    if served != digest:
        raise Failure(f"{client.registry.ref(tag)} resolves to {served}, but the push produced {digest}",
                      rule="push-verified", hint="someone else pushed the same tag meanwhile; push again")
