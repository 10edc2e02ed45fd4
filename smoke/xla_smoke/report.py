"""Check results and the three ways they leave the container: summary text, report.json and junit.xml.

The JSON keys are a contract with the host side (xla-images parses report.json): change them only together
with SCHEMA_VERSION. Standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

from xla_smoke import SCHEMA_VERSION, SUITE_NAME

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
ERROR = "error"
STATUSES = (PASSED, FAILED, SKIPPED, ERROR)
FAILING_STATUSES = (FAILED, ERROR)

REPORT_JSON = "report.json"
JUNIT_XML = "junit.xml"


@dataclasses.dataclass
class Outcome:
    """What a check returns; the runner adds its name and duration."""

    status: str
    message: str
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


def passed(message: str, **metrics: Any) -> Outcome:
    return Outcome(PASSED, message, metrics)


def failed(message: str, **metrics: Any) -> Outcome:
    return Outcome(FAILED, message, metrics)


def skipped(message: str, **metrics: Any) -> Outcome:
    return Outcome(SKIPPED, message, metrics)


def verdict(problems: list[str], success_message: str, **metrics: Any) -> Outcome:
    """Failed with every problem listed, or passed: checks collect problems instead of stopping at the first."""
    if problems:
        return failed("; ".join(problems), **metrics)
    return passed(success_message, **metrics)


@dataclasses.dataclass
class CheckResult:
    name: str
    status: str
    seconds: float
    message: str
    metrics: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "metrics": _json_safe(self.metrics),
        }


def empty_suite_metrics(layers: int) -> dict[str, Any]:
    """Every suite-level metric key, present even when the check that measures it was not run."""
    return {
        "layers": layers,
        "compile_loop_s": None,
        "compile_scan_s": None,
        "compile_ratio": None,
        "compile_sweep": [],
        "trace_steps_per_s": None,
        "trace_steps_per_s_iqr": None,
    }


def build(expected: dict[str, Any], environment: dict[str, Any], results: list[CheckResult],
          suite_metrics: dict[str, Any], seconds: float) -> dict[str, Any]:
    counts = {status: sum(1 for r in results if r.status == status) for status in STATUSES}
    return {
        "suite": SUITE_NAME,
        "schema": SCHEMA_VERSION,
        "expected": _json_safe(expected),
        "environment": _json_safe(environment),
        "checks": [r.as_dict() for r in results],
        "metrics": _json_safe(suite_metrics),
        "summary": {**counts, "seconds": round(seconds, 3)},
    }


def succeeded(report: dict[str, Any]) -> bool:
    summary = report["summary"]
    return summary[FAILED] == 0 and summary[ERROR] == 0


def write(report: dict[str, Any], report_dir: Path) -> list[Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / REPORT_JSON
    junit_path = report_dir / JUNIT_XML
    json_path.write_text(to_json(report) + "\n", encoding="utf-8")
    junit_path.write_bytes(to_junit(report))
    return [json_path, junit_path]


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False, allow_nan=False)


def to_junit(report: dict[str, Any]) -> bytes:
    summary = report["summary"]
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", {
        "name": SUITE_NAME,
        "tests": str(len(report["checks"])),
        "failures": str(summary[FAILED]),
        "errors": str(summary[ERROR]),
        "skipped": str(summary[SKIPPED]),
        "time": f"{summary['seconds']:.3f}",
    })
    properties = ET.SubElement(suite, "properties")
    for section in ("expected", "environment"):
        for key, value in report[section].items():
            ET.SubElement(properties, "property", {"name": f"{section}.{key}", "value": _text(value)})
    for check in report["checks"]:
        _junit_case(suite, check)
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def _junit_case(suite: ET.Element, check: dict[str, Any]) -> None:
    case = ET.SubElement(suite, "testcase", {
        "classname": SUITE_NAME, "name": check["name"], "time": f"{check['seconds']:.3f}"})
    status = check["status"]
    if status in (FAILED, ERROR, SKIPPED):
        tag = {FAILED: "failure", ERROR: "error", SKIPPED: "skipped"}[status]
        element = ET.SubElement(case, tag, {"message": check["message"]})
        if status != SKIPPED:
            element.text = check["message"]
    if check["metrics"]:
        ET.SubElement(case, "system-out").text = json.dumps(check["metrics"], sort_keys=True)


def render_summary(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"{SUITE_NAME}: python {_text(env.get('python'))}, torch {_text(env.get('torch'))}, "
        f"torch_xla {_text(env.get('torch_xla'))}, libtpu {_text(env.get('libtpu'))}, "
        f"ABI {_abi_text(env.get('cxx11_abi'))}, device {_text(env.get('device'))}",
    ]
    width = max((len(c["name"]) for c in report["checks"]), default=0)
    for check in report["checks"]:
        lines.append(f"  {check['status'].upper():8} {check['name']:{width}} {check['seconds']:7.1f}s  "
                     f"{check['message']}")
    lines.extend(_metric_lines(report["metrics"]))
    summary = report["summary"]
    lines.append(", ".join(f"{summary[s]} {s}" for s in STATUSES) + f" in {summary['seconds']:.1f}s")
    return "\n".join(lines)


def _metric_lines(metrics: dict[str, Any]) -> list[str]:
    lines = []
    for point in metrics.get("compile_sweep") or []:
        lines.append(f"  compile time, {point['layers']} decoder layers fwd+bwd: "
                     f"loop {_number(point['compile_loop_s'], '.1f')}s, "
                     f"scan_layers {_number(point['compile_scan_s'], '.1f')}s, "
                     f"ratio {_number(point['compile_ratio'], '.2f')}x")
    if metrics.get("trace_steps_per_s") is not None:
        lines.append(f"  tracing: {_number(metrics['trace_steps_per_s'], '.1f')} steps/s "
                     f"(IQR {_number(metrics['trace_steps_per_s_iqr'], '.1f')})")
    return lines


def _number(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _abi_text(cxx11: Optional[bool]) -> str:
    return "?" if cxx11 is None else ("cxx11" if cxx11 else "pre-cxx11")


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON; report them as null rather than writing a file the host cannot parse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
