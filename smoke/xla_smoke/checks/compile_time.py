"""compile_time: XLA compile seconds of N Mixtral-style decoder blocks, forward + backward, as a loop vs with
scan_layers.

The seconds are torch_xla's own CompileTime metric (the sum over the compiles the step caused), not wall time,
so tracing and execution do not blur the figure. The ratio loop/scan is the benefit scan_layers brings; the
check fails when it falls below --min-compile-ratio (default 1.2, the margin measured in xla_smoke.context:
a scan_layers that stops paying off lands near 1x or below). Each side's process CPU seconds over the step are
reported beside it: on a shared machine they show how much of a wall-clock figure was waiting for a core. The
larger benchmark target is judged by a person reading the figure, not asserted here.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.models import COMPILE_DIMS, DecoderBlock, clone_layers, decoder_input, decoder_layers
from xla_smoke.numerics import mismatch
from xla_smoke.report import Outcome, failed, passed

SEED = 21
# Loop and scan compute the same loss; dozens of float32 layers in another order drift a little.
LOSS_RTOL = 1e-3


@dataclasses.dataclass(frozen=True)
class Compiled:
    seconds: float  # CompileTime metric delta
    compiles: int
    wall_seconds: float  # trace + compile + run, for context only
    cpu_seconds: float  # this process's CPU time over the same span (all its threads), for context only
    loss: torch.Tensor


def run(context: Context) -> Outcome:
    device = compat.device()
    problems: list[str] = []
    points: list[dict[str, Any]] = []
    for layers in context.layers:
        point, point_problems = _measure(layers, device)
        points.append(point)
        problems += point_problems
    headline = max(points, key=lambda point: point["layers"])
    context.suite_metrics.update(
        layers=headline["layers"], compile_loop_s=headline["compile_loop_s"],
        compile_scan_s=headline["compile_scan_s"], compile_ratio=headline["compile_ratio"],
        compile_sweep=[{key: point[key] for key in ("layers", "compile_loop_s", "compile_scan_s", "compile_ratio")}
                       for point in points])
    summary = (f"{headline['layers']} layers: loop {headline['compile_loop_s']:.1f}s, scan_layers "
               f"{headline['compile_scan_s']:.1f}s, ratio {headline['compile_ratio']:.2f}x")
    # Written as "not >=" so that a NaN ratio (nothing measured) can never pass.
    if not headline["compile_ratio"] >= context.min_compile_ratio:
        problems.append(f"below the minimum ratio {context.min_compile_ratio:g}x")
    metrics = {"sweep": points, "min_compile_ratio": context.min_compile_ratio,
               "workload": dataclasses.asdict(COMPILE_DIMS)}
    if problems:
        return failed(f"{summary}: " + "; ".join(problems), **metrics)
    return passed(summary, **metrics)


def _measure(layers: int, device: torch.device) -> tuple[dict[str, Any], list[str]]:
    blocks = decoder_layers(layers, COMPILE_DIMS, SEED + layers)
    x = decoder_input(COMPILE_DIMS, SEED)
    loop = _compile(_loop_forward, clone_layers(blocks, device), x.to(device).requires_grad_())
    scan = _compile(compat.scan_layers, clone_layers(blocks, device), x.to(device).requires_grad_())
    problems = []
    for name, compiled in (("loop", loop), ("scan_layers", scan)):
        if compiled.compiles == 0:
            problems.append(f"{layers} layers, {name}: no XLA compilation observed (graph served from a cache?); "
                            f"the compile time cannot be measured")
    loss_problem = mismatch(f"{layers} layers: scan_layers loss vs loop loss", loop.loss, scan.loss, LOSS_RTOL, 0.0)
    if loss_problem:
        problems.append(loss_problem)
    ratio = loop.seconds / scan.seconds if scan.seconds > 0 else float("nan")
    point = {
        "layers": layers,
        "compile_loop_s": round(loop.seconds, 3),
        "compile_scan_s": round(scan.seconds, 3),
        "compile_ratio": round(ratio, 3),
        "loop_compiles": loop.compiles,
        "scan_compiles": scan.compiles,
        "loop_wall_s": round(loop.wall_seconds, 3),
        "scan_wall_s": round(scan.wall_seconds, 3),
        "loop_cpu_s": round(loop.cpu_seconds, 3),
        "scan_cpu_s": round(scan.cpu_seconds, 3),
    }
    return point, problems


def _loop_forward(blocks: list[DecoderBlock], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def _compile(forward: Callable[[list[DecoderBlock], torch.Tensor], torch.Tensor], blocks: list[DecoderBlock],
             x: torch.Tensor) -> Compiled:
    """Trace forward + backward as one graph, run it, and read how long XLA spent compiling it."""
    compat.sync()  # nothing else may ride along in the measured graph
    compat.wait_device_ops()
    before = compat.compile_stats()
    started, cpu_started = time.perf_counter(), time.process_time()
    output = forward(blocks, x)
    loss = (output * output).mean()
    loss.backward()
    compat.sync()
    compat.wait_device_ops()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    spent = compat.compile_stats().since(before)
    return Compiled(spent.seconds, spent.count, wall, cpu, loss.detach().cpu())
