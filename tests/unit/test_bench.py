"""bench: figures taken from a smoke report, the --json shape, and the PNG plot."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from xla_images.model.flavour import Abi, Accelerator
from xla_images.model.site import WheelSource
from xla_images.model.target import Target
from xla_images.run.checking import bench, smoke_runner


def flavour(tag_python: str = "3.11") -> Target:
    return Target(torch_xla="2.9.0", torch="2.9.0", python=tag_python, abi=Abi.CXX11, accelerator=Accelerator.CPU,
                   libtpu=None, release_default_abi=Abi.CXX11, pytorch_git_rev="v2.9.1", xla_git_rev="v2.9.0",
                   wheel_source=WheelSource("default"), base_image="python:3.11-slim-bookworm",
                   declared_at="matrix.yaml:1")


def smoke(report: dict[str, Any] | None, exit_code: int = 0) -> smoke_runner.SmokeResult:
    return smoke_runner.SmokeResult("r2.9.0_3.11_cpu", exit_code, 42.0, report, None, None, "tail")


def report(checks: list[dict[str, Any]], sweep: list[dict[str, Any]], trace: float | None) -> dict[str, Any]:
    return {"checks": checks, "summary": {"passed": 1, "failed": 0, "skipped": 0, "error": 0},
            "metrics": {"compile_sweep": sweep, "trace_steps_per_s": trace, "trace_steps_per_s_iqr": 3.5}}


SWEEP = [{"layers": 16, "compile_loop_s": 6.0, "compile_scan_s": 3.0, "compile_ratio": 2.0},
         {"layers": 8, "compile_loop_s": 3.0, "compile_scan_s": 2.5, "compile_ratio": 1.2}]


def test_figures_come_from_the_sweep_sorted_by_layers() -> None:
    result = bench.from_smoke(flavour(), "img", smoke(report([], SWEEP, 120.0)))
    assert [p.layers for p in result.sweep] == [8, 16]
    assert result.headline is not None and result.headline.ratio == 2.0
    data = result.to_json()
    assert data["layers"] == [8, 16] and data["compile_loop_s"] == [3.0, 6.0] and data["compile_scan_s"] == [2.5, 3.0]
    assert data["compile_ratio"] == [1.2, 2.0]
    assert data["trace_steps_per_s"] == 120.0 and data["trace_steps_per_s_iqr"] == 3.5
    assert result.complete


def test_a_ratio_below_threshold_still_counts_but_a_missing_figure_does_not() -> None:
    slow_scan = report([{"name": "compile_time", "status": "failed", "message": "ratio 0.9 below 1.0"}], SWEEP, 99.0)
    assert bench.from_smoke(flavour(), "img", smoke(slow_scan, 1)).complete
    broken = report([{"name": "tracing", "status": "error", "message": "boom"}], SWEEP, None)
    result = bench.from_smoke(flavour(), "img", smoke(broken, 1))
    assert not result.complete and result.problems == ("tracing: boom",)


def test_no_report_is_incomplete() -> None:
    result = bench.from_smoke(flavour(), "img", smoke(None, 1))
    assert not result.complete and result.sweep == () and "no report" in result.problems[0]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    results = [bench.from_smoke(flavour(), "img", smoke(report([], SWEEP, 120.0))),
               bench.from_smoke(flavour("3.10"), "img", smoke(None, 1))]
    path = tmp_path / "out" / "compile.png"
    bench.plot(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
