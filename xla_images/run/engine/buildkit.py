"""BuildKit: `docker buildx build` / `docker buildx bake` as subprocesses.

The SDK has no BuildKit session (secrets, the BuildKit frontend), so BuildKit builds go through the docker CLI's
buildx plugin, against the engine DOCKER_HOST names. With buildx's `docker` driver (the engine's own BuildKit)
the result lands in the engine's image store. With any other driver (docker-container, ...) only `--load` brings
it there (buildx exports the image as a tarball and the engine loads it; docs.docker.com/build/builders/drivers:
"images built using other drivers aren't automatically loaded"), and `--load` is what the classic image store's
builds pass; the containerd store's `--output type=image,...` below exports into the builder's own store, which
for a docker-container builder is not the engine's, so there the image never reaches the engine.

Into the containerd image store, a build exports its layers already compressed the way they will be pushed
(`--output type=image,compression=...`): the engine then pushes the stored blobs, with no compression pass.
There the image's id is its manifest digest, which buildx writes to --metadata-file (its --iidfile holds the
config digest, which that store does not know as an image).

A registry cache (`RegistryCache`: `--cache-to type=registry,...,mode=max` and `--cache-from`) carries a build's
layers, every stage's, to the next engine that builds the flavour or a relative of it. buildx 0.13.1's `docker`
driver on dockerd 26 exports and imports it when the engine keeps images in the containerd store (measured:
docs/engines.md); the classic store's docker driver refuses cache export, so there the cache needs a
docker-container builder. The engine and the buildx subprocesses reach the same engine: buildx reads DOCKER_HOST,
DOCKER_TLS_VERIFY, DOCKER_CERT_PATH and DOCKER_CONTEXT from the environment it inherits (settings.child_environment).
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ... import settings
from ...errors import Failure
from ...model.compression import LAYER_MEDIA_TYPES, Compression
from ...model.published import is_digest
from ...model.site import build_cache_refs, build_cache_to
from . import builds, connection


BUILDER_ENV = settings.BUILDER.env[0]  # buildkit | classic | auto (default): declared in xla_images/settings.py
_BUILDKIT_STEP = re.compile(r"^#\d+ \[(?P<step>[^\]]+)\] (?P<what>.*)$")
_BUILDKIT_ERROR = re.compile(r"^(ERROR|error): (?P<message>.*)$")
_NAMED_DANGLING = re.compile(r"naming to moby-dangling@(sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class RegistryCache:
    """BuildKit's registry cache for one build: exported (mode=max: every stage's layers) to `to`, imported from
    each of `sources` (its own ref first, then its relatives': what one of them built is reused)."""

    to: str
    sources: tuple[str, ...]

    def arguments(self, export: Compression | None) -> list[str]:
        arguments: list[str] = []
        for ref in self.sources:
            arguments += ["--cache-from", f"type=registry,ref={ref}"]
        return arguments + ["--cache-to", build_cache_to(self.to, export)]


def registry_cache(repository: str, tag: str, relatives: list[str] = ()) -> RegistryCache:
    """The cache of flavour `tag` in `repository` (the site's build_cache): model.site.build_cache_refs."""
    refs = build_cache_refs(repository, tag, relatives)
    return RegistryCache(refs[0], refs)


@dataclass(frozen=True)
class BuildxInfo:
    """What `docker buildx` offers here; `problem` says why BuildKit cannot be used (None: it can)."""

    version: str | None
    driver: str | None
    problem: str | None


@functools.lru_cache(maxsize=1)
def buildx_info() -> BuildxInfo:
    """`docker buildx version` and the current builder's driver, asked once per process."""

    if shutil.which("docker") is None:
        return BuildxInfo(None, None, "no `docker` CLI on PATH (buildx is a plugin of it)")
    try:
        version = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True, timeout=30)
        if version.returncode != 0:
            return BuildxInfo(None, None, "`docker buildx` is not installed: " + _last_line(version.stderr))
        inspect = subprocess.run(["docker", "buildx", "inspect"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return BuildxInfo(None, None, f"`docker buildx` does not answer: {error}")
    words = version.stdout.split()
    driver = next((line.split(":", 1)[1].strip() for line in inspect.stdout.splitlines()
                   if line.startswith("Driver:")), None)
    if inspect.returncode != 0 or driver is None:
        return BuildxInfo(words[1] if len(words) > 1 else version.stdout.strip(), None,
                          "the current buildx builder does not answer: " + _last_line(inspect.stderr))
    return BuildxInfo(words[1] if len(words) > 1 else version.stdout.strip(), driver, None)


def use_buildkit(builder: str) -> bool:
    """BuildKit when buildx works (or the builder setting, XLA_IMAGES_BUILDER=buildkit, demands it), else the
    classic builder. `builder` is the setting's word (settings.read_builder, read at the CLI's edge)."""
    wanted = builder.strip().lower()
    if wanted == "classic":
        return False
    info = buildx_info()
    if wanted == "buildkit" and info.problem:
        raise Failure(f"{BUILDER_ENV}=buildkit, but BuildKit cannot be used: {info.problem}", rule="buildkit",
                      hint="`ci/engine.sh install` installs docker-buildx; `build.py doctor` shows what is missing")
    return info.problem is None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


class BuildKitBuild:
    """One `docker buildx build`, streamed line by line, which another thread may abort.

    Same contract as StreamingBuild: the image is left untagged (no `-t`), its id comes from --iidfile (the
    classic store) or --metadata-file (`export` given: the containerd store, layers compressed as `export`). BuildKit
    runs steps inside the engine, not as containers, and keeps failed steps in its cache rather than as
    images: a failed or aborted build leaves neither. Aborting sends SIGINT, on which buildx cancels the build
    session (the engine then stops the step), and SIGKILL if it does not stop within a grace period.
    """

    def __init__(self, context: Path, buildargs: dict[str, str], labels: dict[str, str] | None = None,
                 target: str | None = None, secrets: dict[str, Path] | None = None, no_cache: bool = False,
                 export: Compression | None = None, cache: RegistryCache | None = None) -> None:
        self.context = Path(context)
        self.buildargs = dict(buildargs)
        self.labels = dict(labels or {})
        self.target = target
        self.secrets = dict(secrets or {})
        self.no_cache = no_cache
        self.export = export
        self.cache = cache
        self.trace = builds.BuildTrace()
        self._aborted = threading.Event()
        self._process = None
        self._lock = threading.Lock()

    def command(self, iidfile: Path, metadata: Path) -> list[str]:
        command = ["docker", "buildx", "build", "--progress=plain", *self.output(), "--iidfile", str(iidfile),
                   "--metadata-file", str(metadata), "--file", str(self.context / "Dockerfile")]
        for name, value in sorted(self.buildargs.items()):
            command += ["--build-arg", f"{name}={value}"]
        for name, value in sorted(self.labels.items()):
            command += ["--label", f"{name}={value}"]
        for name, path in sorted(self.secrets.items()):
            command += ["--secret", f"id={name},src={path}"]
        if self.target:
            command += ["--target", self.target]
        if self.no_cache:
            command.append("--no-cache")
        if self.cache is not None:
            command += self.cache.arguments(self.export)
        return command + [str(self.context)]

    def output(self) -> list[str]:
        return ["--load"] if self.export is None else ["--output", image_output(self.export)]

    def run(self, on_line: connection.LineSink) -> str:
        def watch(line: str) -> None:
            # The containerd store names a result before buildx writes its metadata file: an abort between the
            # two still leaves the image's id for the clean-up.
            if found := _NAMED_DANGLING.search(line):
                self.trace.images.append(builds.short_id(found.group(1)))
            on_line(line)

        with tempfile.TemporaryDirectory(prefix="xla-images-iid-") as scratch:
            iidfile, metadata = Path(scratch) / "iid", Path(scratch) / "metadata.json"
            errors = run_buildx(self.command(iidfile, metadata), watch, self._started)
            image_id = _manifest_digest(metadata) if self.export else _read_id(iidfile)
        if image_id:
            self.trace.images.append(builds.short_id(image_id))
            self.trace.image_id = image_id
        if self._aborted.is_set():
            raise builds.BuildAborted()
        if errors is not None:
            raise Failure(errors, rule="build")
        if not image_id:
            raise Failure("buildx ended without an image id", rule="build")
        return image_id

    def _started(self, process) -> None:
        with self._lock:
            self._process = process
            if self._aborted.is_set():
                _stop(process)

    def abort(self) -> None:
        with self._lock:
            self._aborted.set()
            process = self._process
        if process is not None:
            _stop(process)


def image_output(export: Compression) -> str:
    """The `--output` of a build into the containerd store: every layer (the base's too) compressed as `export`,
    with OCI media types for zstd (which has no Docker media type) and Docker's for gzip."""
    options = ["type=image", f"compression={export.format}", "force-compression=true",
               f"oci-mediatypes={str(export.format != 'gzip').lower()}"]
    if export.level is not None:
        options.append(f"compression-level={export.level}")
    return ",".join(options)


def exported_layer_media_type(export: Compression) -> str:
    """The media type every layer of a build exported by `image_output(export)` is stored with."""
    return LAYER_MEDIA_TYPES[export.format][0]


def _read_id(path: Path) -> str:
    return path.read_text().strip() if path.is_file() else ""


def _manifest_digest(path: Path) -> str:
    """`containerimage.digest` of a buildx metadata file ("" when there is none: the build failed)."""
    try:
        digest = json.loads(path.read_text()).get("containerimage.digest", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return digest if is_digest(digest) else ""


def run_buildx(command: list[str], on_line: connection.LineSink, started: Callable | None = None) -> str | None:
    """Run a buildx command, handing each output line to `on_line`; None on success, else the error text.

    The process gets its own session: a terminal's Ctrl-C reaches the toolkit, which decides (abort) rather
    than buildx dying half-way through exporting.
    """

    env = settings.child_environment({"BUILDX_NO_DEFAULT_ATTESTATIONS": "1", "DOCKER_CLI_HINTS": "false"})
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace", env=env, start_new_session=True)
    except OSError as error:
        raise Failure(f"cannot run docker buildx: {error}", rule="buildkit",
                      hint="install the docker CLI and docker-buildx (`ci/engine.sh install`)") from None
    if started is not None:
        started(process)
    errors: list[str] = []
    try:
        for raw in process.stdout:
            line = raw.rstrip("\n")
            found = _BUILDKIT_ERROR.match(line)
            if found:
                errors.append(found.group("message"))
            if line.strip():
                on_line(line)
    finally:
        if process.poll() is None and process.stdout is not None:
            _stop(process)
        process.wait()
    if process.returncode == 0:
        return None
    return "; ".join(errors) or f"docker buildx exited with {process.returncode}"


def _stop(process, grace: float = 20) -> None:

    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()


def buildkit_step(line: str) -> str | None:
    """`[wheels 4/5] RUN ...` from a plain-progress line that starts a step, else None."""
    found = _BUILDKIT_STEP.match(line)
    return f"[{found.group('step')}] {found.group('what')}" if found else None


def bake(files: list[Path], targets: list[str], on_line: connection.LineSink, *, no_cache: bool = False,
         overrides: list[str] = (), export: Compression | None = None) -> None:
    """`docker buildx bake -f F... TARGETS --load` (with `export`: into the containerd store, its layers
    compressed so, as BuildKitBuild does); a failed bake is a Failure naming buildx's error."""
    command = ["docker", "buildx", "bake", "--progress=plain"]
    command += ["--load"] if export is None else ["--set", f"*.output={image_output(export)}"]
    for path in files:
        command += ["-f", str(path)]
    for override in overrides:
        command += ["--set", override]
    if no_cache:
        command.append("--no-cache")
    errors = run_buildx(command + list(targets), on_line)
    if errors is not None:
        raise Failure(f"docker buildx bake failed: {errors}", rule="bake")
