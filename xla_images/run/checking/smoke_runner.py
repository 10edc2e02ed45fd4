"""Run the smoke suite (`python -m xla_smoke`, shipped in every image) in a fresh container.

The container reports into /reports; its report.json and junit.xml are copied out to
reports/<tag>/smoke.json and smoke.xml before the container is removed (always, also on failure or Ctrl-C).
On this machine the suite runs on the PJRT CPU device; `tpu=True` runs it the way a TPU VM needs
(privileged, host network, 16G shm, PJRT_DEVICE=TPU).
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import diskio
from ...errors import Failure
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


def run_options(flavour: Flavour, tpu: bool) -> engine.containers.RunOptions:
    """CPU unless asked for a TPU: TPU flavours still import and run on the PJRT CPU device."""
    if tpu:
        return engine.containers.RunOptions(environment={"PJRT_DEVICE": Accelerator.TPU.pjrt_device}, privileged=True,
                                            network_mode="host", shm_size="16G")
    return engine.containers.RunOptions(environment={"PJRT_DEVICE": Accelerator.CPU.pjrt_device})


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
