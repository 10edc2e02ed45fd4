"""The environment check against the real torch/torch_xla of this venv: matching expectations pass, each
kind of mismatch fails with exit code 1 and a message naming both sides, missing expectations fail."""
from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

import importlib.metadata  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional  # noqa: E402

SMOKE_DIR = Path(__file__).resolve().parents[2] / "smoke"
if str(SMOKE_DIR) not in sys.path:
    sys.path.insert(0, str(SMOKE_DIR))

from xla_smoke import cli  # noqa: E402

EXPECTATION_FIELDS = ("tag", "abi", "python", "torch", "torch_xla", "libtpu", "accelerator")


def _installed(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def actual_expectations() -> dict[str, str]:
    """What this venv really is, read independently of the suite (metadata and torch's own flag)."""
    import torch
    return {
        "tag": "host-venv",
        "abi": "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "pre-cxx11",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": _installed("torch").split("+")[0],
        "torch_xla": _installed("torch_xla").split("+")[0],
        "libtpu": _installed("libtpu") or "",
        "accelerator": "cpu",
    }


def flags(values: dict[str, str]) -> list[str]:
    result = []
    for field, value in values.items():
        result += [f"--expect-{field.replace('_', '-')}", value]
    return result


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expectations must come only from what each test passes, not from the shell that runs pytest."""
    for field in EXPECTATION_FIELDS:
        monkeypatch.delenv(f"XLA_IMAGES_{field.upper()}", raising=False)
    monkeypatch.setenv("PJRT_DEVICE", "CPU")


def run_environment(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["--only", "environment", "--json", *args])
    report = json.loads(capsys.readouterr().out)
    return code, report


def environment_check(report: dict[str, Any]) -> dict[str, Any]:
    (check,) = report["checks"]
    assert check["name"] == "environment"
    return check


def test_matching_expectations_pass(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    code, report = run_environment(capsys, *flags(expected))
    check = environment_check(report)
    assert (code, check["status"]) == (0, "passed"), check["message"]
    assert report["expected"] == expected
    env = report["environment"]
    assert env["device"] == "CPU"
    assert env["torch_xla"].split("+")[0] == expected["torch_xla"]
    assert env["cxx11_abi"] is (expected["abi"] == "cxx11")


def test_wrong_abi_fails_naming_both_abis(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    wrong = "pre-cxx11" if expected["abi"] == "cxx11" else "cxx11"
    code, report = run_environment(capsys, *flags({**expected, "abi": wrong}))
    check = environment_check(report)
    assert (code, check["status"]) == (1, "failed")
    assert "C++ ABI mismatch" in check["message"]
    assert f"expects {wrong}" in check["message"]
    assert f"built {expected['abi']}" in check["message"]
    assert report["summary"]["failed"] == 1


def test_wrong_torch_version_fails(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    code, report = run_environment(capsys, *flags({**expected, "torch": "1.13.1"}))
    check = environment_check(report)
    assert (code, check["status"]) == (1, "failed")
    assert "torch version mismatch: expected 1.13.1" in check["message"]
    assert _installed("torch") in check["message"]


def test_local_version_label_is_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    code, report = run_environment(capsys, *flags({**expected, "torch_xla": expected["torch_xla"] + "+cxx11"}))
    assert (code, environment_check(report)["status"]) == (0, "passed")


def test_missing_expectations_are_reported_not_passed(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    del expected["tag"], expected["torch"]
    code, report = run_environment(capsys, *flags(expected))
    check = environment_check(report)
    assert (code, check["status"]) == (1, "failed")
    assert "no expectation for tag (set $XLA_IMAGES_TAG or --expect-tag)" in check["message"]
    assert "no expectation for torch " in check["message"]
    assert check["metrics"]["missing_expectations"] == ["tag", "torch"]
    assert report["expected"]["tag"] is None


def test_environment_variables_supply_expectations_and_flags_override(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    expected = actual_expectations()
    for field, value in expected.items():
        monkeypatch.setenv(f"XLA_IMAGES_{field.upper()}", value)
    code, report = run_environment(capsys)
    assert (code, environment_check(report)["status"]) == (0, "passed")

    monkeypatch.setenv("XLA_IMAGES_TORCH", "0.0.1")
    code, report = run_environment(capsys)
    assert (code, environment_check(report)["status"]) == (1, "failed")
    code, report = run_environment(capsys, "--expect-torch", expected["torch"])
    assert (code, environment_check(report)["status"]) == (0, "passed")


def test_libtpu_expected_but_absent_fails(capsys: pytest.CaptureFixture[str]) -> None:
    if _installed("libtpu") is not None:
        pytest.skip("this venv has libtpu installed")
    expected = actual_expectations()
    code, report = run_environment(capsys, *flags({**expected, "libtpu": "0.0.21"}))
    check = environment_check(report)
    assert (code, check["status"]) == (1, "failed")
    assert "libtpu: expected 0.0.21, but it is not installed" in check["message"]
    assert report["environment"]["libtpu"] is None


def test_invalid_abi_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    expected = actual_expectations()
    code = cli.main(["--only", "environment", *flags({**expected, "abi": "cxx14"})])
    captured = capsys.readouterr()
    assert code == 2
    assert "cxx14" in captured.err and captured.out == ""


def test_unopenable_device_fails_the_environment_and_stops_the_other_checks(tmp_path: Path) -> None:
    """A TPU image started without a TPU (PJRT_DEVICE=TPU, no libtpu here): the report still gets written."""
    if _installed("libtpu") is not None:
        pytest.skip("this venv has libtpu installed")
    import os
    import subprocess
    env = {**os.environ, "PYTHONPATH": str(SMOKE_DIR), "PJRT_DEVICE": "TPU"}
    result = subprocess.run([sys.executable, "-m", "xla_smoke", "--only", "environment,scan", "--report-dir",
                             str(tmp_path), *flags(actual_expectations())],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    environment, scan = report["checks"]
    assert environment["status"] == "failed"
    assert "torch_xla could not open its device (PJRT_DEVICE=TPU)" in environment["message"]
    assert scan["status"] == "error" and scan["message"].startswith("not run, torch_xla is unusable")
    assert report["environment"]["device"] is None


@pytest.mark.parametrize("expected, actual, matches", [
    ("3.11", "3.11.7", True),
    ("2.9.0", "2.9.0+cu128", True),
    ("2.6.0+cxx11", "2.6.0", True),
    ("2.9.0", "2.9.1", False),
    ("2.9.0", "2.9", False),
    ("3.1", "3.11.7", False),
])
def test_version_matching_uses_public_release_components(expected: str, actual: str, matches: bool) -> None:
    from xla_smoke.expectations import version_matches
    assert version_matches(expected, actual) is matches
