"""The numerical checks against real torch_xla on the host (PJRT CPU), with small settings.

compile_time runs in a fresh interpreter: compile seconds can only be measured once per graph and process
(a second run in the same process is served from torch_xla's graph cache, which the check reports).
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SMOKE_DIR = Path(__file__).resolve().parents[2] / "smoke"
if str(SMOKE_DIR) not in sys.path:
    sys.path.insert(0, str(SMOKE_DIR))

from xla_smoke import cli  # noqa: E402
from xla_smoke.context import DEFAULT_MIN_COMPILE_RATIO  # noqa: E402


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")


def run_checks(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["--json", *args])
    return code, json.loads(capsys.readouterr().out)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def test_scan_and_scan_layers_match_their_references(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_checks(capsys, "--only", "scan,scan_layers")
    checks = by_name(report)
    assert checks["scan"]["status"] == "passed", checks["scan"]["message"]
    assert checks["scan"]["metrics"]["cases"] == ["tensor", "tuple", "dict"]
    assert checks["scan"]["metrics"]["second_call_compiles"] == 0
    assert checks["scan_layers"]["status"] == "passed", checks["scan_layers"]["message"]
    assert checks["scan_layers"]["metrics"]["parameters_compared"] > 0
    assert code == 0


def test_scan_comparison_detects_a_wrong_result() -> None:
    """The comparison the scan check relies on must flag a scan that differs from the eager loop."""
    import torch

    from xla_smoke import compat
    from xla_smoke.checks import scan as scan_check
    from xla_smoke.numerics import tree_mismatches

    case = scan_check.CASES[1]
    init, xs = case.inputs(seed=5)
    expected_carry, expected_ys, _ = scan_check._eager_reference(case.fn, init, xs)
    device = compat.device()
    # Scanning one step fewer than the reference: values of the right structure, wrong content.
    short_xs = tuple(t[:-1].to(device) for t in xs)
    carry, ys = compat.scan(case.fn, tuple(t.to(device) for t in init), short_xs)
    compat.sync()
    problems = tree_mismatches("carry", expected_carry, carry) + tree_mismatches("ys", expected_ys, ys)
    assert any("carry" in p and "max abs difference" in p for p in problems)
    assert any("ys" in p and "shape" in p for p in problems)
    assert not tree_mismatches("same", expected_carry, tuple(t.clone() for t in expected_carry))
    assert torch.isfinite(expected_carry[0]).all()


def test_host_offload_lowering_and_its_detector(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_checks(capsys, "--only", "host_offload,host_offload_exec")
    checks = by_name(report)
    lowering = checks["host_offload"]
    assert lowering["status"] == "passed", lowering["message"]
    assert lowering["metrics"]["round_trips"] >= 1
    assert lowering["metrics"]["to_pinned_host"] >= 1 and lowering["metrics"]["to_device"] >= 1
    assert checks["host_offload_exec"]["status"] == "skipped"
    assert checks["host_offload_exec"]["message"] == "executing host offload needs a TPU (PJRT_DEVICE=CPU)"
    assert code == 0


def test_host_offload_detector_rejects_graphs_without_a_round_trip() -> None:
    import torch

    from xla_smoke import compat
    from xla_smoke.checks.host_offload import placement_problems

    place_to_host, place_to_device = compat.host_offload_ops()
    device = compat.device()
    x = torch.randn(4, 4).to(device)

    plain = compat.hlo_text([torch.sin(x)])
    problems, counts = placement_problems(*plain)
    assert counts["placement_calls"] == 0
    assert any("pinned_host" in p for p in problems) and any('"device"' in p for p in problems)

    # Offloaded and brought back, but a *different* value comes back to device: not a round trip.
    unrelated = compat.hlo_text([place_to_host(x * 2) + 0 * place_to_device(x * 3)])
    problems, counts = placement_problems(*unrelated)
    assert counts["to_pinned_host"] == 1 and counts["to_device"] == 1 and counts["round_trips"] == 0
    assert problems == ["the value moved back to device is not the one offloaded to pinned_host"]

    round_trip = compat.hlo_text([place_to_device(place_to_host(x * 2)) + 1])
    problems, counts = placement_problems(*round_trip)
    assert (problems, counts["round_trips"]) == ([], 1)


def test_tracing_reports_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_checks(capsys, "--only", "tracing", "--trace-repeats", "3")
    check = by_name(report)["tracing"]
    assert check["status"] == "passed", check["message"]
    rates = check["metrics"]["repeats"]
    assert len(rates) == 3 and all(rate > 0 for rate in rates)
    assert check["metrics"]["compiles_while_timed"] == 0
    assert report["metrics"]["trace_steps_per_s"] == check["metrics"]["trace_steps_per_s"]
    assert min(rates) <= report["metrics"]["trace_steps_per_s"] <= max(rates)
    assert report["metrics"]["trace_steps_per_s_iqr"] >= 0
    assert code == 0


def test_compile_time_sweep_and_the_default_margin(tmp_path: Path) -> None:
    """At 1 and 2 layers scan_layers' own overhead outweighs what it saves (0.7x measured on 2.9): the check, with
    its default margin, must fail, as it would for a scan_layers that stopped paying off at 16 — and still report
    every figure of the sweep."""
    result = subprocess.run(
        [sys.executable, "-m", "xla_smoke", "--only", "compile_time", "--layers", "2,1", "--report-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(SMOKE_DIR), "PJRT_DEVICE": "CPU"})
    assert result.returncode == 1, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    check = report["checks"][0]
    assert check["status"] == "failed"
    assert f"below the minimum ratio {DEFAULT_MIN_COMPILE_RATIO:g}x" in check["message"]
    assert check["metrics"]["min_compile_ratio"] == DEFAULT_MIN_COMPILE_RATIO > 1
    metrics = report["metrics"]
    assert [point["layers"] for point in metrics["compile_sweep"]] == [1, 2]
    for point in metrics["compile_sweep"]:
        assert point["compile_loop_s"] > 0 and point["compile_scan_s"] > 0
        assert point["compile_ratio"] == pytest.approx(point["compile_loop_s"] / point["compile_scan_s"], rel=1e-2)
    assert metrics["layers"] == 2
    assert metrics["compile_ratio"] == metrics["compile_sweep"][-1]["compile_ratio"]
    for point in check["metrics"]["sweep"]:
        assert point["loop_compiles"] >= 1 and point["scan_compiles"] >= 1
        assert point["loop_cpu_s"] > 0 and point["scan_cpu_s"] > 0


def test_host_offload_execution_compares_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TPU-only execution path, run on the CPU with the placement calls swapped for plain ops (the CPU
    cannot execute them): correct values pass the comparison, a wrong backward is caught."""
    from xla_smoke import compat
    from xla_smoke.checks import host_offload
    from xla_smoke.context import Context
    from xla_smoke.expectations import Expectations

    monkeypatch.setattr(compat, "device_kind", lambda device=None: "TPU")
    monkeypatch.setattr(compat, "host_offload_ops", lambda: (lambda t: t * 1.0, lambda t: t * 1.0))
    outcome = host_offload.run_execution(Context(Expectations()))
    # Without real placement calls the graph check fails, but no value differs.
    assert outcome.status == "failed"
    assert "pinned_host" in outcome.message and "difference" not in outcome.message

    monkeypatch.setattr(compat, "host_offload_ops", lambda: (lambda t: t * 1.0, lambda t: t * 1.01))
    outcome = host_offload.run_execution(Context(Expectations()))
    assert "gradient 0: max abs difference" in outcome.message


# --- companions (torchvision, torchaudio) ----------------------------------------------------------------------

COMPANION_PINS = {"torchvision": "0.24.0", "torchaudio": "2.9.0"}  # the ones torch 2.9.0 goes with


@pytest.fixture(scope="module")
def companion_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision and torchaudio for the host's torch, installed (no dependencies) into a directory of their own:
    the venv has neither, as an image without `companions:` has neither."""
    import importlib.metadata

    if importlib.metadata.version("torch").split("+")[0] != "2.9.0":
        pytest.skip("the companions pinned here go with torch 2.9.0")
    target = tmp_path_factory.mktemp("companions")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                             *(f"{name}=={version}" for name, version in COMPANION_PINS.items())],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(f"the package index is not reachable here: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr
    return target


def run_in_subprocess(*args: str, site: Path | None = None, companions: str | None = None) -> dict[str, Any]:
    """The suite in a fresh interpreter (an imported torchvision stays imported): its report's checks by name."""
    env = {**os.environ, "PJRT_DEVICE": "CPU",
           "PYTHONPATH": os.pathsep.join(str(path) for path in (SMOKE_DIR, site) if path)}
    env.pop("XLA_IMAGES_COMPANIONS", None)
    if companions is not None:
        env["XLA_IMAGES_COMPANIONS"] = companions
    result = subprocess.run([sys.executable, "-m", "xla_smoke", "--json", *args], capture_output=True, text=True,
                            timeout=600, env=env)
    return by_name(json.loads(result.stdout))


def test_companions_are_skipped_when_the_image_has_none_and_failed_when_it_lacks_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from xla_smoke.checks import companions
    from xla_smoke.context import Context
    from xla_smoke.expectations import Expectations

    context = Context(Expectations())
    monkeypatch.delenv("XLA_IMAGES_COMPANIONS", raising=False)
    monkeypatch.setattr(companions, "installed_version", lambda name: None)
    outcome = companions.run_torchvision(context)
    assert outcome.status == "skipped" and "XLA_IMAGES_COMPANIONS is unset" in outcome.message
    assert companions.run_torchaudio(context).status == "skipped"
    # An image that says it installs one and does not: a failure, never a skip.
    monkeypatch.setenv("XLA_IMAGES_COMPANIONS", "torchvision==0.24.0 torchaudio==2.9.0")
    outcome = companions.run_torchvision(context)
    assert outcome.status == "failed" and "installs torchvision 0.24.0" in outcome.message
    # Another version than the image installs: named, before anything is imported.
    monkeypatch.setattr(companions, "installed_version", lambda name: "0.23.0")
    assert companions.run_torchvision(context).message == "torchvision is 0.23.0, the image installs 0.24.0"


def test_installed_companions_run_their_ops_on_the_xla_device(companion_site: Path) -> None:
    # torchaudio is installed but not named: what a derived image's `pip install torchaudio` makes, checked too.
    checks = run_in_subprocess("--only", "torchvision,torchaudio", site=companion_site,
                               companions=f"torchvision=={COMPANION_PINS['torchvision']}")
    for name, version in COMPANION_PINS.items():
        assert checks[name]["status"] == "passed", checks[name]["message"]
        assert checks[name]["metrics"]["installed"] == version


def test_a_companion_op_that_differs_from_the_cpu_is_a_failure() -> None:
    import torch

    from xla_smoke.checks import companions

    assert companions._compare("op", torch.ones(3), torch.ones(3)) == []
    assert companions._compare("op", torch.ones(3) * 2, torch.ones(3))[0].startswith("op: max abs difference")
