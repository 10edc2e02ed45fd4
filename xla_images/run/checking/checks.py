"""Image checks: what must hold for every built image, run as a real pytest module against the image.

`run(target, report_dir)` runs xla_images/run/checking/image_checks/test_image.py through pytest.main: a container of the
image is started with a sleeping command, testinfra's docker backend runs the in-image checks (versions, ABI,
`import torch_xla`, no compiler) and the container is removed at the end of the session, whatever happened.
What needs no container (labels, env, layers, history) is read from the engine. Results: checks.xml (JUnit,
from pytest) and checks.json (ours) under reports/<tag>/.

The layer scan reads `docker save` as a stream, never to disk: every file of every layer is compared with the
site's CA bundle and matched against build-config and credential patterns. The classic image store saves each
layer as a plain tar; the containerd store saves the blobs it keeps, gzip or zstd, which are read uncompressed.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import signal
import tarfile
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterable, Iterator

import zstandard

from ... import diskio, userfiles
from ...model.target import Target
from ...names import VENV
from ..engine.images import ChunkReader

TEST_MODULE = Path(__file__).with_name("image_checks") / "test_image.py"
CHECKS_XML = "checks.xml"
CHECKS_JSON = "checks.json"

# Files a build must never leave behind: its pip configuration, and anything holding registry or index logins.
PIP_CONFIG_NAMES = frozenset({"pip.conf", "pip.ini"})
BUILD_CONTEXT_DIRS = ("tmp/pip/", "tmp/wheelhouse/")
CREDENTIAL_FILE_NAMES = frozenset({".netrc", ".pypirc", ".git-credentials"})
DOCKER_CONFIG_SUFFIX = ".docker/config.json"
# Where a leaked login would sit: configuration, home and temp directories. Library sources are left out on
# purpose: python's own docs are full of `http://user:password@host` examples.
CONFIG_PREFIXES = ("etc/", "root/", "home/", "tmp/", "var/tmp/", f"{VENV[1:]}/pip.conf", f"{VENV[1:]}/pyvenv.cfg")
CONFIG_SCAN_LIMIT = 1 << 20
URL_CREDENTIALS = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]+:[^/\s@'\"]+@")
SECRET_WORDS = re.compile(r"(?i)\b(password|passwd|token|secret|api[_-]?key)\b")
TAR_MAGIC_OFFSET = 257
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class CheckTarget:
    """What the pytest module checks; handed to it through a plugin fixture."""

    flavour: Target
    image: str
    ca_bundle: Path | None
    tpu: bool = False
    # A layer scan of `image` already under way (started beside the smoke suite); None: the checks scan.
    layer_scan: BackgroundLayerScan | None = None


@dataclass(frozen=True)
class Finding:
    where: str  # layer id, `label`, `env` or `history`
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.problem}: {self.path} ({self.where})"


@dataclass
class LayerScan:
    layers: int = 0
    files: int = 0
    findings: list[Finding] = field(default_factory=list)

    def of(self, *problems: str) -> list[Finding]:
        return [finding for finding in self.findings if finding.problem in problems]


# --- layers ----------------------------------------------------------------------------------------------

class _Prefixed(io.RawIOBase):
    """`head` followed by the rest of `stream`: lets us sniff a member's first block and still read it whole."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def scan_saved_image(chunks: Iterable[bytes], ca_bundle: bytes | None) -> LayerScan:
    """Scan every layer of a `docker save` stream (legacy `<id>/layer.tar` or OCI `blobs/sha256/<d>`)."""
    scan = LayerScan()
    for layer_id, stream in saved_layers(chunks):
        scan.layers += 1
        with tarfile.open(fileobj=stream, mode="r|") as layer:
            for entry in layer:
                scan.files += 1
                scan.findings.extend(_file_findings(layer, entry, layer_id, ca_bundle))
    return scan


def scan_image_layers(chunks: Iterable[bytes], ca_bundle: Path | None) -> LayerScan:
    """`scan_saved_image` against the site's CA bundle file (None: no bundle configured)."""
    bundle = userfiles.read_bytes(ca_bundle, limit=userfiles.CA_LIMIT) if ca_bundle else None  # the site's file
    return scan_saved_image(chunks, bundle)


class BackgroundLayerScan:
    """`scan_saved_image` of one image on a thread of its own, so its wait on `docker save` (disk-bound: the
    containerd store reads its blobs at the disk's cold-read speed, ~1 minute for r2.9.0 here) overlaps with
    something CPU-bound, the smoke suite. `result()` waits for it; `stop()` ends it early (after the chunk it is
    on) and drops the export's connection. The thread is a daemon: an interrupt never waits on it."""

    STOP_WAIT_S = 10.0

    def __init__(self, chunks: Iterator[bytes], ca_bundle: Path | None) -> None:
        self._chunks = chunks
        self._ca_bundle = ca_bundle
        self._stopping = threading.Event()
        self._scan: LayerScan | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="xla-images-layer-scan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._scan = scan_image_layers(self._until_stopped(), self._ca_bundle)
        except BaseException as error:  # handed to whoever asks for the result, on their thread
            self._error = error
        finally:
            with contextlib.suppress(Exception):
                self._chunks.close()  # type: ignore[attr-defined]

    def _until_stopped(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            if self._stopping.is_set():
                raise _ScanStopped
            yield chunk

    def result(self) -> LayerScan:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._scan is not None
        return self._scan

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(self.STOP_WAIT_S)


class _ScanStopped(Exception):
    """The layer scan was stopped before its end; nobody asks for its result."""


def saved_layers(chunks: Iterable[bytes]) -> Iterator[tuple[str, BinaryIO]]:
    """Each layer of a `docker save` stream as (the first 12 hex of its name, its tar uncompressed), in the
    stream's order. Each stream is valid until the next one is asked for. Members that are no tar once
    uncompressed (config blobs, manifests) are passed over."""
    stream = io.BufferedReader(ChunkReader(chunks), buffer_size=1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for member in outer:
            if not member.isfile() or not _may_be_layer(member.name):
                continue
            handle = outer.extractfile(member)
            if handle is None:
                continue
            layer = _uncompressed(handle)
            head = layer.read(512)
            if len(head) < 512 or head[TAR_MAGIC_OFFSET:TAR_MAGIC_OFFSET + 5] != b"ustar":
                continue  # a config blob or manifest, not a layer
            yield _layer_id(member.name), io.BufferedReader(_Prefixed(head, layer), 1 << 20)


def _uncompressed(handle: BinaryIO) -> BinaryIO:
    """The member's bytes, through gzip or zstd when its first bytes say it is compressed."""
    magic = handle.read(4)
    raw = io.BufferedReader(_Prefixed(magic, handle), 1 << 20)
    if magic.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic == ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _may_be_layer(name: str) -> bool:
    return name.endswith("/layer.tar") or name.startswith("blobs/sha256/")


def _layer_id(name: str) -> str:
    return name.removesuffix("/layer.tar").rpartition("/")[2][:12]


def _file_findings(layer: tarfile.TarFile, entry: tarfile.TarInfo, layer_id: str,
                   ca_bundle: bytes | None) -> Iterator[Finding]:
    path = str(PurePosixPath(entry.name.removeprefix("./")))
    name = PurePosixPath(path).name
    if name.startswith(".wh."):
        return  # a whiteout marks a deletion; it holds nothing
    if name in PIP_CONFIG_NAMES:
        yield Finding(layer_id, path, "pip-config")
    if any(path.startswith(prefix) or path + "/" == prefix for prefix in BUILD_CONTEXT_DIRS):
        yield Finding(layer_id, path, "build-context")
    if name in CREDENTIAL_FILE_NAMES or path.endswith(DOCKER_CONFIG_SUFFIX):
        yield Finding(layer_id, path, "credentials-file")
    if not entry.isfile():
        return
    wants_ca = ca_bundle is not None and entry.size == len(ca_bundle)
    wants_text = entry.size <= CONFIG_SCAN_LIMIT and path.startswith(CONFIG_PREFIXES)
    if not (wants_ca or wants_text):
        return
    handle = layer.extractfile(entry)
    data = handle.read() if handle is not None else b""
    if wants_ca and data == ca_bundle:
        yield Finding(layer_id, path, "ca-bundle")
    if wants_text and URL_CREDENTIALS.search(data.decode("utf-8", errors="replace")):
        yield Finding(layer_id, path, "url-credentials")


# --- metadata --------------------------------------------------------------------------------------------

def scan_metadata(labels: dict[str, str], env: list[str], history: list[dict[str, Any]]) -> list[Finding]:
    """Credentials in labels, environment or build history (where `docker history` shows them to anyone)."""
    texts = [("label", f"{key}={value}") for key, value in labels.items()]
    texts += [("env", item) for item in env]
    texts += [("history", str(step.get("CreatedBy", ""))) for step in history]
    texts += [("history", str(step.get("Comment", ""))) for step in history if step.get("Comment")]
    findings = []
    for where, text in texts:
        if URL_CREDENTIALS.search(text):
            findings.append(Finding(where, _clip(text), "url-credentials"))
        if SECRET_WORDS.search(text):
            findings.append(Finding(where, _clip(text), "secret-word"))
    return findings


def _clip(text: str, limit: int = 120) -> str:
    # Findings name where a secret is, never the secret: only a prefix of the text is kept.
    return text if len(text) <= limit else text[:limit] + "..."


# --- running the pytest module ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckOutcome:
    name: str
    status: str  # passed | failed | skipped | error
    seconds: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3),
                "message": self.message}


@dataclass(frozen=True)
class ChecksResult:
    tag: str
    image: str
    outcomes: tuple[CheckOutcome, ...]
    seconds: float
    exit_code: int
    xml_path: Path
    json_path: Path

    def count(self, status: str) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status == status)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.count("failed") and not self.count("error") and bool(self.outcomes)

    def failures(self) -> list[str]:
        if not self.outcomes:
            return [f"pytest exited with code {self.exit_code} before running any check (output above)"]
        return [f"{o.name}: {o.message}" for o in self.outcomes if o.status in ("failed", "error")]

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "image": self.image,
            "exit_code": self.exit_code,
            "summary": {status: self.count(status) for status in ("passed", "failed", "skipped", "error")}
            | {"seconds": round(self.seconds, 3)},
            "checks": [outcome.to_json() for outcome in self.outcomes],
        }


class _Recorder:
    """Records each test's outcome (setup, call and teardown folded into one) for checks.json."""

    def __init__(self) -> None:
        self.outcomes: dict[str, CheckOutcome] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.rpartition("::")[2]
        previous = self.outcomes.get(name)
        if previous is not None and previous.status in ("failed", "error", "skipped"):
            return  # a teardown must not hide the failure or skip it follows
        seconds = report.duration + (previous.seconds if previous else 0.0)
        if report.outcome == "passed":
            self.outcomes[name] = CheckOutcome(name, "passed", seconds, "")
        elif report.when == "call":
            self.outcomes[name] = CheckOutcome(name, report.outcome, seconds, _message(report))
        else:
            status = "skipped" if report.skipped else "error"
            self.outcomes[name] = CheckOutcome(name, status, seconds, _message(report))


def _target_plugin(target: CheckTarget) -> types.ModuleType:
    """A plugin (module-like, as conftest files are) whose only job is the session fixture `target`."""
    import pytest

    def target_fixture() -> CheckTarget:
        return target

    plugin = types.ModuleType("xla_images_check_target")
    plugin.target = pytest.fixture(scope="session", name="target")(target_fixture)  # type: ignore[attr-defined]
    return plugin


def _message(report: Any) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else ""
    return str(report.longrepr or "")[:500]


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[threading.Event]:
    """An event set by every SIGINT/SIGTERM while the block runs; the handlers in place still run after it.

    pytest.main catches Ctrl-C itself, and on an unlucky frame its report of it crashes (a traceback entry
    without a line number: TypeError in _pytest/_code/code.py, seen in CI on python 3.11): whatever pytest.main
    then raises is known for the interrupt it is. Off the main thread, where handlers cannot be set, the event
    stays unset.
    """
    noted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame: types.FrameType | None) -> None:
        handler = previous[signum]
        if handler == signal.SIG_IGN:
            return
        noted.set()
        if callable(handler):
            handler(signum, frame)
        else:
            raise KeyboardInterrupt

    for signum in previous:
        signal.signal(signum, note)
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(target: CheckTarget, report_dir: Path, *, keyword: str | None = None, quiet: bool = True) -> ChecksResult:
    """Run the image checks; write checks.xml and checks.json into report_dir."""
    import pytest

    report_dir.mkdir(parents=True, exist_ok=True)
    xml_path, json_path = report_dir / CHECKS_XML, report_dir / CHECKS_JSON
    for stale in (xml_path, json_path):
        stale.unlink(missing_ok=True)  # an earlier run's report must never pass for this one
    recorder = _Recorder()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xla-images-checks-") as scratch:
        # pytest writes its JUnit file even when interrupted: it goes in place only once the run is whole.
        scratch_xml = Path(scratch) / CHECKS_XML
        # Our own ini: the checks must not pick up the options or conftest of whatever project runs them.
        ini = Path(scratch) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        args = [str(TEST_MODULE), "-c", str(ini), "--rootdir", str(TEST_MODULE.parent),
                "--confcutdir", str(TEST_MODULE.parent), "-p", "no:cacheprovider", "-p", "no:randomly",
                f"--junitxml={scratch_xml}", "-o", f"junit_suite_name=image-checks-{target.flavour.tag}",
                "-o", "junit_family=xunit2", "--tb=short", "-rfEs"]
        if quiet:
            args.append("-q")
        if threading.current_thread() is not threading.main_thread():
            # pytest's capture swaps the process's own stdout and stderr (file descriptors 1 and 2) while a check
            # runs: off the main thread (`ship` tests an image while the next one builds) it would swallow every
            # other thread's output for minutes. The checks' own output then goes where ours goes.
            args.append("--capture=no")
        if keyword:
            args += ["-k", keyword]
        with _noting_interrupts() as interrupted:
            try:
                exit_code = int(pytest.main(args, plugins=[_target_plugin(target), recorder]))
            except Exception:
                if interrupted.is_set():  # pytest crashed reporting the interrupt: it is still the interrupt
                    raise KeyboardInterrupt from None
                raise
        if exit_code == pytest.ExitCode.INTERRUPTED:
            # pytest swallowed Ctrl-C after its teardown (the container is gone); the caller must stop too.
            raise KeyboardInterrupt
        if scratch_xml.is_file():
            diskio.write_text_atomic(xml_path, scratch_xml.read_text(encoding="utf-8"), "the checks report")
    result = ChecksResult(target.flavour.tag, target.image, tuple(recorder.outcomes.values()),
                          time.monotonic() - started, exit_code, xml_path, json_path)
    diskio.write_text_atomic(json_path, json.dumps(result.to_json(), indent=2) + "\n", "the checks report")
    return result
