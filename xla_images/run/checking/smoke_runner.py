"""Run the smoke suite (`python -m xla_smoke`, shipped in every image) in a fresh container.

The container reports into /reports; its report.json and junit.xml are copied out to
reports/<tag>/smoke.json and smoke.xml before the container is removed (always, also on failure or Ctrl-C).
On this machine the suite runs on the PJRT CPU device; `tpu=True` runs it the way a TPU VM needs
(privileged, host network, 16G shm, PJRT_DEVICE=TPU).

`run_restricted` runs part of the suite (RESTRICTED_CHECKS) under model.running's restricted profile: an arbitrary
UID with GID 0, a read-only root with a tmpfs /tmp, no capabilities, no-new-privileges, no network; its reports
are reports/<tag>/smoke-restricted.json and .xml. The engine cannot copy files out of a tmpfs (nor out of a
read-only root the suite cannot write), so there the reports come back on stdout: base64 lines behind REPORT_MARK,
which the output shown and kept leaves out.
"""
from __future__ import annotations

import base64
import binascii
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import diskio
from ...errors import Failure
from ...model import running
from ...model.flavour import Accelerator, Flavour
from .. import engine

CONTAINER_REPORT_DIR = "/reports"
SUITE_FILES = {"report.json": "smoke.json", "junit.xml": "smoke.xml"}  # suite's name -> ours
EXIT_USAGE = 2
DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class SmokeResult:
    tag: str
    exit_code: int
    seconds: float
    report: dict[str, Any] | None
    json_path: Path | None
    xml_path: Path | None
    output_tail: str

    @property
    def summary(self) -> dict[str, Any]:
        return (self.report or {}).get("summary") or {}

    @property
    def metrics(self) -> dict[str, Any]:
        return (self.report or {}).get("metrics") or {}

    @property
    def ok(self) -> bool:
        return (self.exit_code == 0 and self.report is not None and not self.summary.get("failed")
                and not self.summary.get("error"))

    def failures(self) -> list[str]:
        if self.report is None:
            return [f"no report (exit code {self.exit_code}): {self.output_tail}"]
        return [f"{check['name']}: {check['message']}" for check in self.report.get("checks", [])
                if check.get("status") in ("failed", "error")]


# The part of the suite the restricted profile runs: the versions and device, scan (compiles, runs and
# differentiates on XLA), tracing (the per-step path); the others run in the default profile.
RESTRICTED_CHECKS = ("environment", "scan", "tracing")
RESTRICTED_SUFFIX = "-restricted"
REPORT_MARK = "@@xla-images-report@@"
CHUNK = 3000  # base64 characters per line: well under the engine's 16 KiB log line
RESTRICTED_REPORT_DIR = f"{running.FALLBACK_ROOT}/xla-smoke-reports"
# Runs the suite, then prints each report as REPORT_MARK lines (name, chunk); exits with the suite's code.
RELAY = (
    "import base64, os, subprocess, sys\n"
    "code = subprocess.call([sys.executable, '-m', 'xla_smoke', *sys.argv[1:]])\n"
    "for name in ('report.json', 'junit.xml'):\n"
    "    path = os.path.join({directory!r}, name)\n"
    "    if os.path.isfile(path):\n"
    "        data = base64.b64encode(open(path, 'rb').read()).decode()\n"
    "        for start in range(0, len(data), {chunk}):\n"
    "            print({mark!r}, name, data[start:start + {chunk}], flush=True)\n"
    "sys.exit(code)\n"
)


def options_for(profile: running.RunProfile) -> engine.containers.RunOptions:
    """The engine's options for a run profile (model.running: the same description `run-spec` prints)."""
    return engine.containers.RunOptions(
        environment=dict(profile.environment), privileged=profile.privileged, network_mode=profile.network,
        shm_size=profile.shm_size, user=profile.user, read_only=profile.read_only,
        tmpfs={mount: running.TMPFS_OPTIONS for mount in profile.tmpfs}, cap_drop=profile.cap_drop,
        security_opt=("no-new-privileges",) if profile.no_new_privileges else ())


def run_options(flavour: Flavour, tpu: bool) -> engine.containers.RunOptions:
    """CPU unless asked for a TPU: TPU flavours still import and run on the PJRT CPU device."""
    return options_for(running.tpu_profile() if tpu else running.default_profile(Accelerator.CPU))


def suite_command(layers: Sequence[int] | None = None, only: Sequence[str] | None = None) -> list[str]:
    # The reports come back as files; stdout stays the human summary, which is what a person watching reads.
    command = ["python", "-m", "xla_smoke", "--report-dir", CONTAINER_REPORT_DIR]
    if layers:
        command += ["--layers", ",".join(str(n) for n in layers)]
    if only:
        command += ["--only", ",".join(only)]
    return command


def run(flavour: Flavour, image: str, report_dir: Path, *, tpu: bool = False, layers: Sequence[int] | None = None,
        only: Sequence[str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        on_line: Callable[[str], None] | None = None, role: str = "smoke") -> SmokeResult:
    """Run the suite in `image` and collect its reports into `report_dir` (smoke.json, smoke.xml)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    for ours in SUITE_FILES.values():
        # A stale report from an earlier run must never pass for this one.
        (report_dir / ours).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="xla-images-smoke-") as scratch:
        outcome = engine.containers.run_container(image, suite_command(layers, only), role=role,
                                                  options=run_options(flavour, tpu), timeout=timeout,
                                                  copy_out=(CONTAINER_REPORT_DIR, Path(scratch)), on_line=on_line)
        collected = _collect(Path(scratch), report_dir)
    if outcome.exit_code == EXIT_USAGE:
        raise Failure(f"the smoke suite in {image} refused its arguments: {_tail(outcome.output)}",
                      rule="smoke-usage", hint="is the image's xla_smoke older than this xla-images? rebuild it")
    report = json.loads(collected.read_text(encoding="utf-8")) if collected else None
    json_path = report_dir / SUITE_FILES["report.json"]
    xml_path = report_dir / SUITE_FILES["junit.xml"]
    return SmokeResult(flavour.tag, outcome.exit_code, outcome.seconds, report,
                       json_path if json_path.is_file() else None, xml_path if xml_path.is_file() else None,
                       _tail(outcome.output))


def restricted_names() -> dict[str, str]:
    """The suite's report names -> ours for the restricted run (smoke-restricted.json, smoke-restricted.xml)."""
    return {theirs: ours.replace("smoke.", f"smoke{RESTRICTED_SUFFIX}.") for theirs, ours in SUITE_FILES.items()}


def restricted_command(only: Sequence[str] = RESTRICTED_CHECKS) -> list[str]:
    relay = RELAY.format(directory=RESTRICTED_REPORT_DIR, chunk=CHUNK, mark=REPORT_MARK)
    return ["python", "-c", relay, "--report-dir", RESTRICTED_REPORT_DIR, "--only", ",".join(only)]


def run_restricted(flavour: Flavour, image: str, report_dir: Path, *, profile: running.RunProfile | None = None,
                   only: Sequence[str] = RESTRICTED_CHECKS, timeout: float = DEFAULT_TIMEOUT_S,
                   on_line: Callable[[str], None] | None = None) -> SmokeResult:
    """Run `only` of the suite under the restricted profile; reports into `report_dir` (smoke-restricted.*)."""
    names = restricted_names()
    report_dir.mkdir(parents=True, exist_ok=True)
    for ours in names.values():
        (report_dir / ours).unlink(missing_ok=True)

    def shown(line: str) -> None:
        if on_line is not None and not line.startswith(REPORT_MARK):
            on_line(line)

    outcome = engine.containers.run_container(image, restricted_command(only), role="smoke-restricted",
                                              options=options_for(profile or running.restricted_profile()),
                                              timeout=timeout, on_line=shown if on_line else None)
    if outcome.exit_code == EXIT_USAGE:
        raise Failure(f"the smoke suite in {image} refused its arguments: {_tail(outcome.output)}",
                      rule="smoke-usage", hint="is the image's xla_smoke older than this xla-images? rebuild it")
    reports, output = relayed_reports(outcome.output)
    for theirs, data in reports.items():
        if theirs in names:
            diskio.write_text_atomic(report_dir / names[theirs], data.decode("utf-8", errors="replace"),
                                     "the smoke report")
    json_path, xml_path = report_dir / names["report.json"], report_dir / names["junit.xml"]
    report = json.loads(json_path.read_text(encoding="utf-8")) if json_path.is_file() else None
    return SmokeResult(flavour.tag, outcome.exit_code, outcome.seconds, report,
                       json_path if json_path.is_file() else None, xml_path if xml_path.is_file() else None,
                       _tail(output))


def relayed_reports(output: str) -> tuple[dict[str, bytes], str]:
    """The files RELAY printed (name -> bytes; a file whose base64 does not decode is left out) and the output
    without those lines."""
    chunks: dict[str, list[str]] = {}
    kept = []
    for line in output.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == REPORT_MARK:
            chunks.setdefault(words[1], []).append(words[2])
        else:
            kept.append(line)
    reports = {}
    for name, parts in chunks.items():
        try:
            reports[name] = base64.b64decode("".join(parts), validate=True)
        except (binascii.Error, ValueError):
            continue
    return reports, "\n".join(kept)


def _collect(scratch: Path, report_dir: Path) -> Path | None:
    """Move the suite's reports into place, each whole or not at all (a full disk or Ctrl-C halfway through
    leaves the earlier state, never half a report)."""
    found = None
    for theirs, ours in SUITE_FILES.items():
        source = scratch / theirs
        if source.is_file():
            diskio.write_text_atomic(report_dir / ours, source.read_text(encoding="utf-8", errors="replace"),
                                     "the smoke report")
            if theirs == "report.json":
                found = report_dir / ours
    return found


def _tail(output: str, lines: int = 15) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])
