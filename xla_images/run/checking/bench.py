"""Compile time of a loop vs scan_layers over N decoder layers, and tracing speed, per image.

The figures come from the smoke suite's own compile_time and tracing checks (`--only compile_time,tracing
--layers 8,16,32`), run in a fresh container per image, one image at a time so they do not share the cores.
`plot` draws compile seconds against layer count: a solid loop line and a dashed scan line per flavour.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import diskio, extras
from ...model.flavour import Flavour
from . import smoke_runner

BENCH_CHECKS = ("compile_time", "tracing")
BENCH_JSON = "bench.json"


@dataclass(frozen=True)
class SweepPoint:
    layers: int
    loop_s: float
    scan_s: float
    ratio: float


@dataclass(frozen=True)
class BenchResult:
    tag: str
    image: str
    sweep: tuple[SweepPoint, ...]
    trace_steps_per_s: float | None
    trace_steps_per_s_iqr: float | None
    seconds: float
    problems: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return bool(self.sweep) and self.trace_steps_per_s is not None and not self.problems

    @property
    def headline(self) -> SweepPoint | None:
        return max(self.sweep, key=lambda point: point.layers) if self.sweep else None

    def to_json(self) -> dict[str, Any]:
        headline = self.headline
        return {
            "tag": self.tag,
            "image": self.image,
            "layers": [point.layers for point in self.sweep],
            "compile_loop_s": [point.loop_s for point in self.sweep],
            "compile_scan_s": [point.scan_s for point in self.sweep],
            "compile_ratio": [point.ratio for point in self.sweep],
            "headline_layers": headline.layers if headline else None,
            "headline_compile_ratio": headline.ratio if headline else None,
            "trace_steps_per_s": self.trace_steps_per_s,
            "trace_steps_per_s_iqr": self.trace_steps_per_s_iqr,
            "seconds": round(self.seconds, 1),
            "problems": list(self.problems),
        }


def from_smoke(flavour: Flavour, image: str, result: smoke_runner.SmokeResult) -> BenchResult:
    metrics = result.metrics
    sweep = tuple(
        SweepPoint(int(point["layers"]), float(point["compile_loop_s"]), float(point["compile_scan_s"]),
                   float(point["compile_ratio"]))
        for point in metrics.get("compile_sweep") or []
        if None not in (point.get("compile_loop_s"), point.get("compile_scan_s"), point.get("compile_ratio"))
    )
    # A ratio below the suite's threshold fails compile_time but is still a figure worth showing; only checks
    # that produced no figure count as problems here.
    problems = tuple(line for line in result.failures() if not line.startswith("compile_time:")) \
        if result.report else tuple(result.failures())
    return BenchResult(flavour.tag, image, tuple(sorted(sweep, key=lambda p: p.layers)),
                       metrics.get("trace_steps_per_s"), metrics.get("trace_steps_per_s_iqr"), result.seconds,
                       problems)


def run(flavour: Flavour, image: str, layers: Sequence[int], report_dir: Path, *, tpu: bool = False,
        on_line: Callable[[str], None] | None = None) -> BenchResult:
    # The bench's smoke reports go to a subdirectory: they must not replace the `test` run's smoke.json.
    result = smoke_runner.run(flavour, image, report_dir / "bench", tpu=tpu, layers=layers, only=BENCH_CHECKS,
                              on_line=on_line, role="bench")
    bench = from_smoke(flavour, image, result)
    diskio.write_text_atomic(report_dir / BENCH_JSON, json.dumps(bench.to_json(), indent=2) + "\n",
                             "the bench report")
    return bench


def plot(results: Sequence[BenchResult], path: Path) -> None:
    """PNG of compile seconds vs layers: per flavour one colour, loop solid, scan dashed."""
    extras.require("plot")
    import matplotlib

    matplotlib.use("Agg")  # no display here, in CI or over ssh
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    for index, result in enumerate(results):
        if not result.sweep:
            continue
        colour = f"C{index % 10}"
        layers = [point.layers for point in result.sweep]
        axes.plot(layers, [p.loop_s for p in result.sweep], marker="o", color=colour, label=f"{result.tag} loop")
        axes.plot(layers, [p.scan_s for p in result.sweep], marker="s", linestyle="--", color=colour,
                  label=f"{result.tag} scan_layers")
    axes.set_xlabel("decoder layers (forward + backward)")
    axes.set_ylabel("compile time (s)")
    axes.set_title("PyTorch/XLA compile time: python loop vs scan_layers")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    plt.close(figure)
