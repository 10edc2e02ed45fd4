"""The Docker engine, through the docker SDK. The ONLY module that imports `docker`.

Everything else speaks in image references, ids, labels and paths; engine errors a user can cause (no
engine, missing image) become `Failure`s with a hint, never SDK tracebacks.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import socket
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

import docker
import docker.auth
import docker.errors
import docker.utils
import requests
import urllib3

from .errors import Failure

START_HINT = "start one with `ci/engine.sh start` (installs and runs dockerd), then check with `build.py doctor`"
# Containers this toolkit creates carry this label, so a sweep can find exactly ours.
CREATED_BY_LABEL = "io.xla-images.created-by"
LineSink = Callable[[str], None]


@functools.lru_cache(maxsize=1)
def client() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (default: the local unix socket).

    The API version is negotiated: the SDK may be newer than the engine (dockerd 20.10 speaks 1.41).
    """
    try:
        engine = docker.from_env(version="auto", timeout=600)
        engine.ping()
    except (docker.errors.DockerException, OSError) as error:
        raise Failure(f"no Docker engine answers: {_short(error)}", rule="engine-reachable",
                      hint=START_HINT) from None
    return engine


def api() -> docker.APIClient:
    """The low-level client of `client()` (streaming builds, archives)."""
    return client().api


def engine_version() -> str:
    """`20.10.24+dfsg1 (API 1.41)`."""
    info = client().version()
    return f"{info.get('Version', '?')} (API {info.get('ApiVersion', '?')})"


def extract_from_image(image: str, container_path: str, dest: Path) -> Path:
    """Copy `container_path` (a file or directory) out of `image` into the directory `dest`.

    Returns the path of the copy, `dest / basename(container_path)`; a symlink is followed (as `docker cp
    -L` does) and its target stored under the link's name. The container is created but never started, and
    is always removed, even when the copy fails. Members that would land outside `dest` (absolute paths,
    `..`) are refused; symlinks inside the copy that point outside it are skipped.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(container_path.rstrip("/") or "/").name
    container = _create_stopped(image)
    try:
        archive = _get_archive(container, image, container_path)
    finally:
        remove_container(container.id)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        try:
            tar.extractall(dest, filter=_renaming_filter(name))
        except tarfile.TarError as error:
            raise Failure(f"refusing to extract {container_path} from {image}: {error}",
                          rule="safe-extract") from None
    return dest / name


def _get_archive(container, image: str, container_path: str) -> io.BytesIO:
    try:
        stream, stat = container.get_archive(container_path)
        if stat.get("linkTarget"):
            # The engine reports the fully resolved target: fetch that instead of the link itself.
            stream, stat = container.get_archive(stat["linkTarget"])
        return io.BytesIO(b"".join(stream))
    except docker.errors.NotFound:
        raise Failure(f"{container_path} does not exist in image {image}", rule="image-path-exists") from None


def _renaming_filter(name: str):
    """tarfile filter: store the archive's top entry under `name`, safely (the `data` filter)."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        top, sep, rest = member.name.partition("/")
        member = member.replace(name=name + sep + rest, deep=False)
        try:
            return tarfile.data_filter(member, path)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
            return None

    return keep


def remove_container(container_id: str) -> None:
    """Force-remove a container (and its anonymous volumes); gone already is fine."""
    try:
        client().api.remove_container(container_id, v=True, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as error:
        # 409 "removal already in progress": the engine is removing it already (an aborted build's step
        # container, under load); gone is what we want.
        if getattr(error, "status_code", None) != 409:
            raise


def _create_stopped(image: str):
    try:
        # The command is never run; it only satisfies images without CMD or ENTRYPOINT (imported bases).
        return client().containers.create(image, command=["true"], labels={CREATED_BY_LABEL: "extract"})
    except docker.errors.ImageNotFound:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it with `build.py build TAG` or pull it with `build.py pull TAG`") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot create a container from {image}: {_short(error)}", rule="engine-create") from None


def _short(error: Exception) -> str:
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


# --- engine facts, images and builds (build side) ---

def engine_info() -> dict:
    """`docker info`: DockerRootDir, Driver, CgroupDriver, ServerVersion..."""
    return client().info()


def image_labels(ref: str) -> dict[str, str] | None:
    """The image's labels ({} when it has none), or None when no such image is on the engine."""
    attrs = image_inspect(ref)
    if attrs is None:
        return None
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def image_layers(ref: str) -> list[str]:
    """Diff ids of the image's layers, bottom first (equal ids = the same bytes, stored once)."""
    attrs = image_inspect(ref)
    if attrs is None:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists")
    return list((attrs.get("RootFS") or {}).get("Layers") or [])


def distribution_error(ref: str) -> str | None:
    """None when the registry of `ref` serves it (asked without pulling), else why not."""
    try:
        api().inspect_distribution(ref)
        return None
    except (docker.errors.APIError, requests.exceptions.RequestException) as error:
        return _short(error).splitlines()[0][:200]


def images_labelled(labels: dict[str, str]) -> list[dict]:
    """Images carrying all these labels (engine list entries: Id, RepoTags, Labels, Created, Size)."""
    return api().images(filters={"label": [f"{key}={value}" for key, value in labels.items()]})


def import_rootfs(chunks: Iterable[bytes], repository: str, tag: str, changes: list[str]) -> str:
    """`docker import` a root filesystem tar stream as `repository:tag`; Dockerfile `changes` add config.

    Returns the new image id. The engine tags only a complete import, so a broken stream tags nothing.
    """
    try:
        output = api().import_image(src=iter(chunks), repository=repository, tag=tag, changes=changes,
                                    stream_src=True)
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"importing {repository}:{tag} failed: {_short(error)}", rule="engine-import") from None
    for line in reversed(str(output).splitlines()):
        if '"error"' in line:
            raise Failure(f"importing {repository}:{tag} failed: {line}", rule="engine-import")
    attrs = image_inspect(f"{repository}:{tag}")
    if attrs is None:
        raise Failure(f"the engine did not keep the imported {repository}:{tag}", rule="engine-import")
    return str(attrs["Id"])


def remove_if_unnamed(image_id: str) -> bool:
    """Remove an image that has no tag and no container; True if it was removed."""
    attrs = image_inspect(image_id)
    if attrs is None or attrs.get("RepoTags"):
        return False
    try:
        api().remove_image(image_id)
        return True
    except docker.errors.APIError:
        return False  # a container uses it, or it has children: keep it


class BuildAborted(Exception):
    """The build was cancelled from another thread (Ctrl-C / SIGTERM); the engine stops it on disconnect."""


@dataclass
class BuildTrace:
    """What one build touched, read off its output: enough to clean up after it and nothing more."""

    started: float = field(default_factory=time.time)
    # Short (12 hex) ids of every image a step produced or reused, in order; the first is the base.
    images: list[str] = field(default_factory=list)
    # Short ids of the containers the steps ran in ("Running in ..."; the engine removes them itself).
    containers: list[str] = field(default_factory=list)
    image_id: str | None = None


_STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12})$")
_STEP_CONTAINER = re.compile(r"^ ---> Running in ([0-9a-f]{12})$")


class StreamingBuild:
    """One classic-builder build whose output is streamed, and which another thread may abort.

    Aborting shuts the build's connection down: the engine then cancels the build and kills and removes the
    container of the step in progress. Each build has its own connection, so aborting one never touches
    another.
    """

    def __init__(self, context: Path, buildargs: dict[str, str], labels: dict[str, str] | None = None,
                 target: str | None = None, no_cache: bool = False) -> None:
        self.context = Path(context)
        self.buildargs = dict(buildargs)
        self.labels = dict(labels or {})
        self.target = target
        self.no_cache = no_cache
        self.trace = BuildTrace()
        self._aborted = threading.Event()
        self._responses: list[requests.Response] = []
        self._lock = threading.Lock()

    def run(self, on_line: LineSink) -> str:
        """Build untagged; return the image id. Raises Failure on a failed step, BuildAborted if aborted."""
        own = docker.from_env(version=api().api_version, timeout=None).api
        own.hooks["response"].append(self._remember)
        try:
            events = own.build(path=str(self.context), buildargs=self.buildargs, labels=self.labels, rm=True,
                               forcerm=True, decode=True, pull=False, target=self.target,
                               nocache=self.no_cache)
            if self._aborted.is_set():
                self._disconnect()
            for event in events:
                self._handle(event, on_line)
        except Exception as error:
            if self._aborted.is_set():
                raise BuildAborted() from None  # whatever the cut connection raised
            if isinstance(error, (docker.errors.APIError, requests.exceptions.RequestException,
                                  urllib3.exceptions.HTTPError, OSError)):
                raise Failure(f"the engine failed the build: {_short(error)}", rule="build") from None
            raise
        finally:
            own.close()
        if self._aborted.is_set():
            raise BuildAborted()
        if not self.trace.image_id:
            raise Failure("the build ended without an image (the engine closed the stream)", rule="build")
        return self.trace.image_id

    def abort(self) -> None:
        self._aborted.set()
        self._disconnect()

    def _remember(self, response: requests.Response, *args, **kwargs) -> None:
        with self._lock:
            self._responses.append(response)

    def _disconnect(self) -> None:
        with self._lock:
            responses = list(self._responses)
        for response in responses:
            # shutdown() (unlike close()) wakes the thread blocked reading this socket.
            sock = getattr(getattr(response.raw, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, event: dict, on_line: LineSink) -> None:
        if "error" in event:
            raise Failure(str(event["error"]).strip(), rule="build")
        aux = event.get("aux") or {}
        if aux.get("ID"):
            self.trace.image_id = str(aux["ID"])
        text = event.get("stream")
        if not text:
            return
        for line in text.splitlines():
            self._note(line)
            if line.strip():
                on_line(line)

    def _note(self, line: str) -> None:
        found = _STEP_CONTAINER.match(line)
        if found:
            self.trace.containers.append(found.group(1))
            return
        found = _STEP_IMAGE.match(line)
        if found:
            self.trace.images.append(found.group(1))


# --- BuildKit: `docker buildx build` / `docker buildx bake` as subprocesses ---
# The SDK has no BuildKit session (secrets, the BuildKit frontend), so BuildKit builds go through the docker CLI's
# buildx plugin, against the engine DOCKER_HOST names. With buildx's `docker` driver (the engine's own BuildKit)
# the result lands in the engine's image store; `--load` also covers a docker-container builder.

BUILDER_ENV = "XLA_IMAGES_BUILDER"  # buildkit | classic | auto (default): which builder `build` uses
_BUILDKIT_STEP = re.compile(r"^#\d+ \[(?P<step>[^\]]+)\] (?P<what>.*)$")
_BUILDKIT_ERROR = re.compile(r"^(ERROR|error): (?P<message>.*)$")


@dataclass(frozen=True)
class BuildxInfo:
    """What `docker buildx` offers here; `problem` says why BuildKit cannot be used (None: it can)."""

    version: str | None
    driver: str | None
    problem: str | None


@functools.lru_cache(maxsize=1)
def buildx_info() -> BuildxInfo:
    """`docker buildx version` and the current builder's driver, asked once per process."""
    import shutil
    import subprocess

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


def use_buildkit() -> bool:
    """BuildKit when buildx works (or XLA_IMAGES_BUILDER=buildkit demands it), else the classic builder."""
    import os

    wanted = os.environ.get(BUILDER_ENV, "auto").strip().lower()
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

    Same contract as StreamingBuild: the image is left untagged (no `-t`), its id comes from --iidfile. BuildKit
    runs steps inside the engine, not as containers, and keeps failed steps in its cache rather than as
    images: a failed or aborted build leaves neither. Aborting sends SIGINT, on which buildx cancels the build
    session (the engine then stops the step), and SIGKILL if it does not stop within a grace period.
    """

    def __init__(self, context: Path, buildargs: dict[str, str], labels: dict[str, str] | None = None,
                 target: str | None = None, secrets: dict[str, Path] | None = None, no_cache: bool = False) -> None:
        self.context = Path(context)
        self.buildargs = dict(buildargs)
        self.labels = dict(labels or {})
        self.target = target
        self.secrets = dict(secrets or {})
        self.no_cache = no_cache
        self.trace = BuildTrace()
        self._aborted = threading.Event()
        self._process = None
        self._lock = threading.Lock()

    def command(self, iidfile: Path) -> list[str]:
        command = ["docker", "buildx", "build", "--progress=plain", "--load", "--iidfile", str(iidfile),
                   "--file", str(self.context / "Dockerfile")]
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
        return command + [str(self.context)]

    def run(self, on_line: LineSink) -> str:
        with tempfile.TemporaryDirectory(prefix="xla-images-iid-") as scratch:
            iidfile = Path(scratch) / "iid"
            errors = run_buildx(self.command(iidfile), on_line, self._started)
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if image_id:
            self.trace.images.append(_short_id(image_id))
            self.trace.image_id = image_id
        if self._aborted.is_set():
            raise BuildAborted()
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


def run_buildx(command: list[str], on_line: LineSink, started: Callable | None = None) -> str | None:
    """Run a buildx command, handing each output line to `on_line`; None on success, else the error text.

    The process gets its own session: a terminal's Ctrl-C reaches the toolkit, which decides (abort) rather
    than buildx dying half-way through exporting.
    """
    import os
    import subprocess

    env = {**os.environ, "BUILDX_NO_DEFAULT_ATTESTATIONS": "1", "DOCKER_CLI_HINTS": "false"}
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
    import signal
    import subprocess

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


def bake(files: list[Path], targets: list[str], on_line: LineSink, *, no_cache: bool = False,
         overrides: list[str] = ()) -> None:
    """`docker buildx bake -f F... TARGETS --load`; a failed bake is a Failure naming buildx's error."""
    command = ["docker", "buildx", "bake", "--progress=plain", "--load"]
    for path in files:
        command += ["-f", str(path)]
    for override in overrides:
        command += ["--set", override]
    if no_cache:
        command.append("--no-cache")
    errors = run_buildx(command + list(targets), on_line)
    if errors is not None:
        raise Failure(f"docker buildx bake failed: {errors}", rule="bake")


def remove_build_leftovers(traces: list[BuildTrace], keep: set[str], settle_seconds: float = 30) -> list[str]:
    """Remove what finished, failed or aborted builds left behind; return what was removed.

    Call it only when none of these builds is still running (their step containers would look leftover).
    Containers: those the builds' steps ran in or created from their images since they started (the engine
    removes them itself with forcerm, but an abort races with it). Images: the builds' own untagged images
    without children, i.e. a failed stage's last step or a finished stage not copied into the result;
    removing one also removes its untagged parents nobody else uses. Image ids in `keep` stay.
    """
    if not traces:
        return []
    removed = _remove_step_containers(traces, settle_seconds)
    dangling = {item["Id"] for item in api().images(filters={"dangling": True})}
    keep_short = {_short_id(image) for image in keep}
    for trace in traces:
        for short in reversed(trace.images):
            match = next((image for image in dangling if _short_id(image) == short), None)
            if match is None or short in keep_short:
                continue
            with contextlib.suppress(docker.errors.NotFound):
                try:
                    api().remove_image(match)
                    removed.append(f"image {short}")
                except docker.errors.APIError as error:
                    removed.append(f"image {short} kept: {_short(error)}")
            dangling.discard(match)
    return removed


def _remove_step_containers(traces: list[BuildTrace], settle_seconds: float) -> list[str]:
    since = min(trace.started for trace in traces) - 1
    images = {short for trace in traces for short in trace.images}
    named = {short for trace in traces for short in trace.containers}
    removed: list[str] = []
    deadline = time.monotonic() + settle_seconds
    while True:
        leftovers = [item for item in api().containers(all=True)
                     if item["Created"] >= since
                     and (item["Id"][:12] in named or _short_id(item.get("ImageID", "")) in images)]
        running = [item for item in leftovers if item.get("State") == "running"]
        # The engine kills an aborted step itself; give it a moment before forcing.
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for item in leftovers:
        remove_container(item["Id"])
        removed.append(f"container {item['Id'][:12]}")
    # A removal the engine had already begun (409) ends a moment later; until then the container's image
    # cannot be removed, and would be left dangling.
    ids = {item["Id"] for item in leftovers}
    while ids and time.monotonic() < deadline + settle_seconds:
        ids &= {item["Id"] for item in api().containers(all=True)}
        if ids:
            time.sleep(0.2)
    return removed


def _short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


# --- registry and containers (publish) ---
# Containers for image checks, the smoke suite and benchmarks; pushes, pulls and image inspection for
# publishing. Every container started here is labelled CREATED_BY_LABEL=<role> and removed by the function
# that started it, even on Ctrl-C (removal goes by the container's name, which exists before its id does).
# Imports of this section only (the top of the file belongs to the build side).
import secrets  # noqa: E402
from typing import Iterator  # noqa: E402

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """How to start a container: extra environment, and the TPU VM settings (privileged, host network, shm)."""

    environment: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    network_mode: str | None = None
    shm_size: str | None = None


@dataclass(frozen=True)
class ContainerRun:
    exit_code: int
    output: str
    seconds: float


@contextlib.contextmanager
def running_container(image: str, command: list[str], *, role: str,
                      options: RunOptions | None = None) -> Iterator[str]:
    """Start a detached container and yield its id; it is force-removed on leaving, whatever happened."""
    options = options or RunOptions()
    name = f"xla-images-{role}-{secrets.token_hex(6)}"
    try:
        container = client().containers.create(
            image, command=command, name=name, labels={CREATED_BY_LABEL: role},
            environment=options.environment, privileged=options.privileged,
            network_mode=options.network_mode, shm_size=options.shm_size)
        container.start()
        yield container.id
    except docker.errors.ImageNotFound:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it with `build.py build TAG` or pull it with `build.py pull`") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot run a container of {image}: {_short(error)}", rule="engine-run") from None
    finally:
        _remove_by_name(name)


def _remove_by_name(name: str) -> None:
    try:
        remove_container(name)
    except docker.errors.APIError as error:
        # 409 "removal already in progress": someone else (a sweep) is removing it; gone is what we want.
        if getattr(error, "status_code", None) != 409:
            raise Failure(f"cannot remove container {name}: {_short(error)}", rule="engine-remove") from None


def run_container(image: str, command: list[str], *, role: str, options: RunOptions | None = None,
                  timeout: float = 3600, copy_out: tuple[str, Path] | None = None,
                  on_line: LineSink | None = None) -> ContainerRun:
    """Run `command` to its end in a fresh container; optionally copy a directory out before removal.

    `on_line` sees the output live, called from this thread (so it may raise, e.g. KeyboardInterrupt); the
    timeout holds either way, and the container is removed on every way out.
    """
    import time

    started = time.monotonic()
    with running_container(image, command, role=role, options=options) as container_id:
        if on_line is not None:
            output = _relay_output(container_id, image, on_line, started + timeout)
        exit_code = _wait(container_id, image, timeout - (time.monotonic() - started))
        if on_line is None:
            output = _logs(container_id)
        if copy_out is not None:
            # A command that died before writing leaves nothing to copy; the caller sees the exit code.
            copy_from_container(container_id, copy_out[0], copy_out[1], missing_ok=True)
    return ContainerRun(exit_code, output, time.monotonic() - started)


def _relay_output(container_id: str, image: str, on_line: LineSink, deadline: float) -> str:
    """Follow the logs in a helper thread; hand each line to `on_line` here, until the stream ends."""
    import queue
    import threading
    import time

    lines: queue.Queue[str | None] = queue.Queue()

    def follow() -> None:
        try:
            for line in _follow_lines(container_id):
                lines.put(line)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            pass  # the container went away (removed on timeout or interrupt): nothing more to relay
        finally:
            lines.put(None)

    threading.Thread(target=follow, name=f"logs-{container_id[:12]}", daemon=True).start()
    seen: list[str] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure(f"a container of {image} did not finish in time", rule="container-timeout",
                          hint="it was removed; raise the timeout or look at the command it ran")
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            continue
        if line is None:
            return "\n".join(seen)
        seen.append(line)
        on_line(line)


def _follow_lines(container_id: str) -> Iterator[str]:
    pending = b""
    for chunk in api().logs(container_id, stream=True, follow=True, stdout=True, stderr=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode("utf-8", errors="replace")
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _wait(container_id: str, image: str, timeout: float) -> int:
    try:
        return int(api().wait(container_id, timeout=max(timeout, 1.0))["StatusCode"])
    except docker.errors.NotFound:
        raise Failure(f"the container of {image} vanished while it ran", rule="container-gone",
                      hint="something else removed it (a clean-up sweep?); run again") from None
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        raise Failure(f"a container of {image} did not finish within {timeout:.0f} s", rule="container-timeout",
                      hint="it was removed; raise the timeout or look at the command it ran") from None


def _logs(container_id: str) -> str:
    return api().logs(container_id, stdout=True, stderr=True).decode("utf-8", errors="replace")


def copy_from_container(container_id: str, container_path: str, dest: Path, *, missing_ok: bool = False) -> Path:
    """Copy the contents of directory `container_path` into `dest` (streamed through a spooled file)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        stream, _ = api().get_archive(container_id, container_path)
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r:") as tar:
                tar.extractall(dest, filter=_strip_top_filter)
    except docker.errors.NotFound:
        if missing_ok:
            return dest
        raise Failure(f"{container_path} does not exist in the container", rule="container-path-exists") from None
    except tarfile.TarError as error:
        raise Failure(f"refusing to extract {container_path}: {error}", rule="safe-extract") from None
    return dest


def _strip_top_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """`reports/smoke.json` -> `smoke.json`; the top directory itself is dropped. Safe like the data filter."""
    _, sep, rest = member.name.partition("/")
    if not sep or not rest:
        return None
    try:
        return tarfile.data_filter(member.replace(name=rest, deep=False), path)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def put_into_container(container_id: str, dest_dir: str, sources: dict[str, Path]) -> None:
    """Copy host files or directories into `dest_dir` (created), each under its key; caches skipped."""
    import io as _io

    buffer = _io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, source in sources.items():
            tar.add(source, arcname=name, filter=lambda info: None if "__pycache__" in info.name else info)
    try:
        exec_id = api().exec_create(container_id, ["mkdir", "-p", dest_dir])["Id"]
        api().exec_start(exec_id)
        api().put_archive(container_id, dest_dir, buffer.getvalue())
    except docker.errors.APIError as error:
        raise Failure(f"cannot copy files into the container: {_short(error)}", rule="container-copy") from None


def containers_created_by(role: str | None = None) -> list[str]:
    """Ids of containers (running or not) this toolkit created, optionally only of one role."""
    label = f"{CREATED_BY_LABEL}={role}" if role else CREATED_BY_LABEL
    return [item["Id"] for item in api().containers(all=True, filters={"label": label})]


def image_inspect(ref: str) -> dict | None:
    """The engine's inspect document of an image (Id, Config.Labels, Config.Env, RepoDigests), or None."""
    try:
        return api().inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as error:
        if getattr(error, "status_code", None) == 404:
            return None
        raise Failure(f"cannot inspect {ref}: {_short(error)}", rule="engine-inspect") from None


def image_history(ref: str) -> list[dict]:
    """One entry per layer-producing step, newest first (CreatedBy, Comment, Size)."""
    try:
        return list(api().history(ref))
    except docker.errors.ImageNotFound:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists") from None


def save_image_stream(ref: str) -> Iterator[bytes]:
    """`docker save` as a stream of chunks: read it once, never held whole (images reach 8 GB)."""
    try:
        yield from api().get_image(ref, chunk_size=4 << 20)
    except docker.errors.ImageNotFound:
        raise Failure(f"image {ref} is not on this engine", rule="image-exists") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot export {ref}: {_short(error)}", rule="engine-save") from None


def tag_image(image: str, repository: str, tag: str) -> None:
    try:
        api().tag(image, repository, tag, force=True)
    except docker.errors.APIError as error:
        raise Failure(f"cannot tag {image} as {repository}:{tag}: {_short(error)}", rule="engine-tag") from None


def remove_tag(ref: str) -> None:
    """Drop one name of an image; the image stays while other names or containers use it. Absent is fine."""
    try:
        api().remove_image(ref, noprune=True)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as error:
        if getattr(error, "status_code", None) != 404:
            raise Failure(f"cannot untag {ref}: {_short(error)}", rule="engine-untag") from None


def prune_build_cache() -> int:
    """Drop every build-cache record that no running build uses; return the bytes reclaimed.

    Images stay whole: their layers belong to the image store. What goes is BuildKit's copy of each stage, for a
    real flavour ~7.5 GB (the wheels stage's installed venv), which is kept otherwise until the engine's own
    garbage collection decides.
    """
    try:
        answer = api().prune_builds(all=True)
    except docker.errors.APIError as error:
        raise Failure(f"cannot prune the engine's build cache: {_short(error)}", rule="engine-prune") from None
    return int((answer or {}).get("SpaceReclaimed") or 0)


def remove_image(ref: str, *, force: bool = False) -> bool:
    """Remove an image by name or id (with its now-unused layers). False when it was not there."""
    try:
        api().remove_image(ref, force=force)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as error:
        raise Failure(f"cannot remove {ref}: {_short(error)}", rule="engine-remove") from None


# Push progress statuses: the engine HEADs each blob first and uploads only what the registry lacks.
PUSH_UPLOADED = "Pushed"
PUSH_PRESENT = ("Layer already exists", "Mounted from")


def push_image(repository: str, tag: str, auth_config: dict | None, on_line: LineSink | None = None,
               layer_status: dict[str, str] | None = None) -> str:
    """Push `repository:tag`; return the manifest digest the engine reports. Errors become Failures.

    `layer_status`, when given, receives per layer (the first 12 hex of its diff id, as the engine names it)
    `uploaded` or `present`: what the registry already had by digest was not sent again.
    """
    digest = None
    try:
        for event in api().push(repository, tag=tag, stream=True, decode=True, auth_config=auth_config):
            if "error" in event:
                raise Failure(f"push of {repository}:{tag} failed: {event['error'].strip()}", rule="push",
                              hint=_registry_hint(repository))
            status = str(event.get("status") or "")
            if layer_status is not None and event.get("id"):
                if status == PUSH_UPLOADED:
                    layer_status[str(event["id"])] = "uploaded"
                elif status.startswith(PUSH_PRESENT):
                    layer_status[str(event["id"])] = "present"
            digest = (event.get("aux") or {}).get("Digest", digest)
            if on_line is not None and event.get("status") and not event.get("progressDetail"):
                on_line(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"push of {repository}:{tag} failed: {_short(error)}", rule="push",
                      hint=_registry_hint(repository)) from None
    if not digest:
        raise Failure(f"the engine reported no digest for {repository}:{tag}", rule="push")
    return digest


# A pull whose engine sends nothing for this long is stalled: seen with dockerd 26 after a layer download was
# reset half-way, where it logged nothing for five minutes and never retried. Progress events arrive several
# times a second while anything downloads or extracts, so minutes of silence mean nothing will come.
PULL_STALL_ENV = "XLA_IMAGES_PULL_STALL_SECONDS"
PULL_STALL_SECONDS = 120.0
PULL_ATTEMPTS = 3


class _PullStalled(Exception):
    pass


def pull_stall_seconds() -> float:
    """The stall limit: $XLA_IMAGES_PULL_STALL_SECONDS, else PULL_STALL_SECONDS; bad values are a Failure."""
    text = os.environ.get(PULL_STALL_ENV, "").strip()
    if not text:
        return PULL_STALL_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 3600:  # NaN fails too
        raise Failure(f"{PULL_STALL_ENV}={text!r} is not a number of seconds between 1 and 3600", rule="pull-stall",
                      hint=f"unset it for the default ({PULL_STALL_SECONDS:.0f} s)")
    return seconds


def pull_image(ref: str, auth_config: dict | None, on_line: LineSink | None = None, *,
               stall_seconds: float | None = None, attempts: int = PULL_ATTEMPTS) -> str:
    """Pull `ref` (a tag or `@sha256:` digest reference); return the local image id.

    A stall watchdog bounds the pull: when the engine reports no progress for `stall_seconds` (default
    `pull_stall_seconds()`), the request is closed — which makes the engine cancel that pull and drop what it
    had half-downloaded — and the pull starts again, up to `attempts` times; then a Failure (rule `pull-stall`).
    Nothing is tagged by a pull that did not finish.
    """
    stall = stall_seconds if stall_seconds is not None else pull_stall_seconds()
    say = on_line or (lambda _line: None)
    for attempt in range(1, attempts + 1):
        try:
            _pull_once(ref, auth_config, say, stall)
            break
        except _PullStalled:
            if attempt == attempts:
                raise Failure(f"pull of {ref} stalled: the engine reported no progress for {stall:.0f} s, "
                              f"{attempts} times", rule="pull-stall",
                              hint=f"{_registry_hint(ref)}; {PULL_STALL_ENV} sets the limit") from None
            say(f"  no progress for {stall:.0f} s: pulling {ref} again (attempt {attempt + 1} of {attempts})")
    attrs = image_inspect(ref)
    if attrs is None:
        raise Failure(f"{ref} is not on the engine after its pull", rule="pull")
    return str(attrs["Id"])


def _pull_once(ref: str, auth_config: dict | None, say: LineSink, stall: float) -> None:
    """One `POST /images/create`, read with a per-read timeout of `stall` seconds.

    The SDK's `pull` sends its request with no timeout at all, so a silent engine would block it forever;
    this is the same request with a read timeout, and the response is closed on any way out.
    """
    client = api()
    repository, tag = docker.utils.parse_repository_tag(ref)  # a digest comes back as the tag, as dockerd wants
    params = {"fromImage": repository, "tag": tag or "latest"}
    headers = {"X-Registry-Auth": docker.auth.encode_header(auth_config)} if auth_config else {}
    try:
        response = client._post(client._url("/images/create"), params=params, headers=headers, stream=True,
                                timeout=stall)
    except requests.exceptions.Timeout:
        raise _PullStalled() from None
    except requests.exceptions.ConnectionError as error:
        raise Failure(f"pull of {ref} failed: {_short(error)}", rule="pull", hint=_registry_hint(ref)) from None
    try:
        client._raise_for_status(response)
        for event in client._stream_helper(response, decode=True):
            if "error" in event:
                raise Failure(f"pull of {ref} failed: {event['error'].strip()}", rule="pull",
                              hint=_registry_hint(ref))
            if event.get("status") and not event.get("progressDetail"):
                say(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (TimeoutError, socket.timeout, urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout):
        raise _PullStalled() from None
    except requests.exceptions.ConnectionError as error:
        if isinstance(error.args[0] if error.args else None, urllib3.exceptions.ReadTimeoutError):
            raise _PullStalled() from None
        raise Failure(f"pull of {ref} failed: {_short(error)}", rule="pull", hint=_registry_hint(ref)) from None
    except docker.errors.APIError as error:
        raise Failure(f"pull of {ref} failed: {_short(error)}", rule="pull", hint=_registry_hint(ref)) from None
    finally:
        response.close()


def _registry_hint(ref: str) -> str:
    host = ref.split("/", 1)[0]
    return (f"is the registry {host} up? (`ci/registry.sh start` for the suite registry); "
            "credentials come from XLA_IMAGES_REGISTRY_USER/_PASSWORD or `docker login`")


def build_directory(context: Path, tag: str, buildargs: dict[str, str] | None = None,
                    on_line: LineSink | None = None) -> str:
    """Build a plain Dockerfile directory (examples, test images) with the classic builder; return the id."""
    image_id = None
    try:
        for event in api().build(path=str(context), tag=tag, buildargs=buildargs or {}, rm=True,
                                 forcerm=True, decode=True):
            if "error" in event:
                raise Failure(f"building {context} failed: {event['error'].strip()}", rule="build")
            if "stream" in event and on_line is not None:
                text = event["stream"].rstrip("\n")
                if text:
                    on_line(text)
            image_id = (event.get("aux") or {}).get("ID", image_id)
    except docker.errors.APIError as error:
        raise Failure(f"building {context} failed: {_short(error)}", rule="build") from None
    if not image_id:
        raise Failure(f"building {context} reported no image", rule="build")
    return str(image_id)
