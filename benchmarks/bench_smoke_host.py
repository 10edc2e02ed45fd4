#!/usr/bin/env python3
"""Run the xla_smoke suite on the host and print its figures.

Two runs of `python -m xla_smoke`, each in a fresh interpreter (compile seconds are only measurable once per
process):
  1. the default suite, timed end to end (budget: 3 minutes on the 2-core CI host), and
  2. compile_time alone over a layer sweep (default 8,16,32).
Printed: suite wall time, compile seconds loop vs scan_layers and their ratio per layer count (target >= 3x at
32 layers), tracing steps/s with IQR, and the load average before and after (the host may be shared; a loaded
host inflates compile seconds).

Usage: benchmarks/bench_smoke_host.py [--python /path/to/venv/bin/python] [--sweep 8,16,32] [--no-sweep]
The interpreter needs torch and torch_xla; PJRT_DEVICE defaults to CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOKE_DIR = ROOT / "smoke"
BUDGET_SECONDS = 180.0
TARGET_RATIO = 3.0

# Asks the benchmarked interpreter what it is, so the environment check has real expectations to meet.
PROBE = """
import importlib.metadata as md, json, sys, torch
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return ""
print(json.dumps({"abi": "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "pre-cxx11",
                  "python": "%d.%d" % sys.version_info[:2], "torch": v("torch").split("+")[0],
                  "torch_xla": v("torch_xla").split("+")[0], "libtpu": v("libtpu").split("+")[0]}))
"""


def main() -> int:
    args = _parse()
    env = {**os.environ, "PYTHONPATH": str(SMOKE_DIR), "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    env.update(_expectations(args.python, env))
    print(f"interpreter: {args.python}")
    print(f"load average before: {_load()}")

    suite_seconds, suite = _run_suite(args.python, env, [])
    print(f"\ndefault suite: {suite_seconds:.1f}s wall (budget {BUDGET_SECONDS:.0f}s: "
          f"{'within' if suite_seconds <= BUDGET_SECONDS else 'OVER'}), report says {suite['summary']['seconds']:.1f}s")
    for check in suite["checks"]:
        print(f"  {check['status']:8} {check['name']:18} {check['seconds']:6.1f}s  {check['message']}")
    _print_compile(suite["metrics"]["compile_sweep"])
    print(f"tracing: {suite['metrics']['trace_steps_per_s']} steps/s (IQR {suite['metrics']['trace_steps_per_s_iqr']})")

    if args.sweep:
        sweep_seconds, sweep = _run_suite(args.python, env, ["--only", "compile_time", "--layers", args.sweep])
        print(f"\ncompile sweep ({sweep_seconds:.1f}s wall):")
        _print_compile(sweep["metrics"]["compile_sweep"])
    print(f"\nload average after: {_load()}")
    return 0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch + torch_xla")
    parser.add_argument("--sweep", default="8,16,32", help="layer counts for the compile sweep run")
    parser.add_argument("--no-sweep", dest="sweep", action="store_const", const="", help="skip the sweep run")
    return parser.parse_args()


def _expectations(python: str, env: dict[str, str]) -> dict[str, str]:
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    expected = {f"XLA_IMAGES_{key.upper()}": value for key, value in facts.items()}
    expected.update(XLA_IMAGES_TAG="host-benchmark", XLA_IMAGES_ACCELERATOR="cpu")
    return expected


def _run_suite(python: str, env: dict[str, str], extra: list[str]) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as report_dir:
        started = time.perf_counter()
        result = subprocess.run([python, "-m", "xla_smoke", "--report-dir", report_dir, *extra],
                                capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - started
        report_path = Path(report_dir) / "report.json"
        if not report_path.exists():
            sys.exit(f"xla_smoke wrote no report (exit {result.returncode}):\n{result.stderr[-3000:]}")
        report = json.loads(report_path.read_text())
    if result.returncode != 0:
        print(f"note: xla_smoke exited {result.returncode}; failing checks are listed below")
    return seconds, report


def _print_compile(sweep: list[dict[str, Any]]) -> None:
    for point in sweep:
        target = f" (target >= {TARGET_RATIO:g}x)" if point["layers"] == 32 else ""
        print(f"  compile, {point['layers']:3d} decoder layers fwd+bwd: loop {point['compile_loop_s']:6.1f}s  "
              f"scan_layers {point['compile_scan_s']:6.1f}s  ratio {point['compile_ratio']:.2f}x{target}")


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
