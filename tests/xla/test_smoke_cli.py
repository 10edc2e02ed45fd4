"""CLI contract of `python -m xla_smoke`: --list, selection, usage errors (exit 2), report files that parse,
and a check that raises becoming status "error" (exit 1)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402
from pathlib import Path  # noqa: E402

SMOKE_DIR = Path(__file__).resolve().parents[2] / "smoke"
if str(SMOKE_DIR) not in sys.path:
    sys.path.insert(0, str(SMOKE_DIR))

from xla_smoke import checks, cli  # noqa: E402

ALL_CHECKS = ["environment", "scan", "scan_layers", "compile_time", "host_offload", "host_offload_exec", "tracing",
              "torchvision", "torchaudio"]
REPORT_KEYS = {"suite", "schema", "expected", "environment", "checks", "metrics", "summary"}
METRIC_KEYS = {"layers", "compile_loop_s", "compile_scan_s", "compile_ratio", "compile_sweep", "trace_steps_per_s",
               "trace_steps_per_s_iqr"}
CHECK_KEYS = {"name", "status", "seconds", "message", "metrics"}
SUMMARY_KEYS = {"passed", "failed", "skipped", "error", "seconds"}
ENVIRONMENT_KEYS = {"python", "torch", "torch_xla", "libtpu", "cxx11_abi", "device"}


@pytest.fixture(autouse=True)
def cpu_without_expectations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    for name in [name for name in os.environ if name.startswith("XLA_IMAGES_")]:
        monkeypatch.delenv(name)


def test_list_names_every_check_without_torch() -> None:
    # A bare interpreter without torch on the path: --list must not import it.
    result = subprocess.run([sys.executable, "-S", "-m", "xla_smoke", "--list"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(SMOKE_DIR)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ALL_CHECKS
    assert checks.names() == ALL_CHECKS


@pytest.mark.parametrize("args, needle", [
    (["--only", "environment,nonsense"], "--only: unknown check nonsense"),
    (["--skip", "scan,bogus"], "--skip: unknown check bogus"),
    (["--only", "scan", "--skip", "scan"], "no checks left to run"),
    (["--only", ","], "--only needs at least one check name"),
    (["--layers", "8,x"], "not a comma-separated list of integers"),
    (["--layers", "0"], "layer counts must be positive"),
    (["--trace-repeats", "0"], "must be at least 1"),
    (["--min-compile-ratio", "-1"], "must be a number >= 0"),
    (["--expect-accelerator", "gpu"], "expected accelerator 'gpu'"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert needle in captured.err
    assert captured.out == ""


def test_unknown_check_exits_2_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "xla_smoke", "--only", "nope"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(SMOKE_DIR)}, timeout=60)
    assert result.returncode == 2
    assert "unknown check nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_run_as_a_module_leaves_nothing_in_the_temp_dir(tmp_path: Path) -> None:
    """torch makes a temp dir on import and removes it at exit; the suite leaves through os._exit, so it removes
    that dir itself."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    result = subprocess.run([sys.executable, "-m", "xla_smoke", "--only", "environment"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(SMOKE_DIR), "TMPDIR": str(temp)},
                            timeout=300)
    assert result.returncode == 1, result.stderr  # no expectations set: the environment check fails, and runs
    assert ", torch_xla 2." in result.stdout  # torch and torch_xla were imported (what makes the dir)
    assert list(temp.iterdir()) == []


def test_report_files_follow_the_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--only", "environment,host_offload,host_offload_exec", "--report-dir", str(tmp_path),
                     "--expect-abi", "cxx11"])
    summary_text = capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())

    assert set(report) == REPORT_KEYS
    assert (report["suite"], report["schema"]) == ("xla_smoke", 1)
    assert set(report["metrics"]) == METRIC_KEYS
    assert report["metrics"]["compile_ratio"] is None and report["metrics"]["compile_sweep"] == []
    assert set(report["summary"]) == SUMMARY_KEYS
    assert ENVIRONMENT_KEYS <= set(report["environment"])
    assert [c["name"] for c in report["checks"]] == ["environment", "host_offload", "host_offload_exec"]
    for check in report["checks"]:
        assert set(check) == CHECK_KEYS
        assert check["status"] in ("passed", "failed", "skipped", "error")
        assert isinstance(check["seconds"], float)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    # Most expectations are missing here, so the environment check fails and so does the run.
    assert statuses == {"environment": "failed", "host_offload": "passed", "host_offload_exec": "skipped"}
    assert code == 1
    assert report["summary"] == {**report["summary"], "passed": 1, "failed": 1, "skipped": 1, "error": 0}
    exec_check = report["checks"][2]
    assert exec_check["message"] == "executing host offload needs a TPU (PJRT_DEVICE=CPU)"

    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    counts = tuple(suite.get(key) for key in ("tests", "failures", "errors", "skipped"))
    assert counts == ("3", "1", "0", "1")
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == ["environment", "host_offload", "host_offload_exec"]
    assert cases["environment"].find("failure") is not None
    assert cases["host_offload"].find("failure") is None and cases["host_offload"].find("skipped") is None
    skipped = cases["host_offload_exec"].find("skipped")
    assert skipped is not None and skipped.get("message") == exec_check["message"]
    assert "FAILED" in summary_text and "SKIPPED" in summary_text


def test_a_check_that_raises_is_an_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The only mock in these tests: a check has to raise for the runner's error path to be exercised.
    import xla_smoke.checks.host_offload as host_offload

    def explode(context: object) -> None:
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(host_offload, "run_lowering", explode)
    code = cli.main(["--only", "host_offload,host_offload_exec", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    check = report["checks"][0]
    assert (check["status"], check["message"]) == ("error", "RuntimeError: lowering exploded")
    assert "lowering exploded" in check["metrics"]["traceback"]
    assert report["checks"][1]["status"] == "skipped"
    assert report["summary"]["error"] == 1
