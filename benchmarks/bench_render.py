#!/usr/bin/env python3
"""How long validating and rendering the whole matrix takes (target: under 1 s). Prints figures, asserts nothing.

    python benchmarks/bench_render.py [--matrix matrix.yaml] [--repeat 5]

Phases: load_plan (parse + validate matrix.yaml and site settings, render every flavour, content-address ids),
render_flavour alone over every flavour (the templates, warm), render --check (compare with the disk, no
network), and the layer layouts render --check also checks: planned and checked from the wheels' cached facts
(a scratch cache holding a copy of this host's wheel facts, no verdicts), then answered from the verdicts that
first run kept. The first load includes importing and compiling the Jinja templates.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xla_images.generate import render  # noqa: E402
from xla_images.generate import sync
from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.cache import CACHE_ENV, cache_dir  # noqa: E402
from xla_images.run.packages import layout


def timed(function, repeat: int) -> tuple[float, list[float], object]:
    results, seconds = None, []
    for _ in range(repeat):
        started = time.perf_counter()
        results = function()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    plan = load_plan(args.matrix)
    cold = time.perf_counter() - started
    files = sum(len(rendered) for rendered in plan.rendered.values())
    print(f"matrix: {len(plan.flavours)} flavours, {files} rendered files")
    print(f"validate + render, first (cold: imports, template compile): {cold * 1000:8.1f} ms")

    median, runs, _ = timed(lambda: load_plan(args.matrix), args.repeat)
    print(f"validate + render + ids (load_plan), warm, median of {len(runs)}: {median * 1000:8.1f} ms "
          f"(min {min(runs) * 1000:.1f}, max {max(runs) * 1000:.1f})")

    median, runs, _ = timed(lambda: [render.render_flavour(flavour) for flavour in plan.flavours], args.repeat)
    print(f"render_flavour x {len(plan.flavours)}, warm, median:               {median * 1000:8.1f} ms "
          f"({median / len(plan.flavours) * 1000:.2f} ms per flavour)")

    median, runs, findings = timed(lambda: sync.check(plan), args.repeat)
    print(f"render --check (disk compare, lock inputs), median:       {median * 1000:8.1f} ms "
          f"({len(findings)} finding(s))")
    bench_layouts(plan, args.repeat)
    print(f"target: validate + render under 1000 ms -> {'met' if cold < 1.0 else 'NOT met'} (cold {cold * 1000:.0f} ms)")


def bench_layouts(plan, repeat: int) -> None:
    facts = cache_dir() / "wheel-facts"
    previous = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="xla-images-bench-render-") as scratch:
        if facts.is_dir():
            shutil.copytree(facts, Path(scratch) / "wheel-facts")
        os.environ[CACHE_ENV] = scratch
        try:
            started = time.perf_counter()
            results = layout.check_locks(plan, plan.flavours, offline=True)
            planned = time.perf_counter() - started
            median, runs, _ = timed(lambda: layout.check_locks(plan, plan.flavours, offline=True), repeat)
        finally:
            if previous is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = previous
    checked = sum(result.checked for result in results)
    print(f"layer layouts: {checked} of {len(results)} locks checkable offline here")
    print(f"layer layouts planned + checked from cached facts:          {planned * 1000:8.1f} ms")
    print(f"layer layouts answered from kept verdicts, median of {len(runs)}:    {median * 1000:8.1f} ms "
          f"({planned / median:.0f}x)")


if __name__ == "__main__":
    main()
