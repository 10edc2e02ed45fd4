#!/usr/bin/env python3
"""Time `xla-images-check` on a real venv (default: this interpreter's, which on the dev host has torch 2.9 +
torch_xla 2.9), or in a real image (--image xla-images:r2.9.0_3.11_cpu, through `docker run`), and print the
figures.

The tool is the zipapp the image carries (run.building.check_tool), run by the venv's python exactly as in the image
(`python -IS tool`), with a constraints file pinning the venv's own torch / torch_xla / libtpu (as render writes it
from the lock); in an image, this checkout's tool is mounted over the image's and the image's own constraints file
is used. Printed: wall time of each run (whole check, without the requirements, without the imports), min and
median, what the imports exercised (top-level modules, modules in all, children) and the load average (the host
may be shared: a loaded host inflates the figures). The issue's aim is the whole check on the 2.9 image under 10 s.

Usage: benchmarks/bench_image_check.py [--venv DIR | --image REF] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xla_images.run.building.check_tool import write_check_tool

PACKAGES = ("torch", "torch_xla", "libtpu")


def constraints_for(venv: Path, path: Path) -> Path:
    """The venv's own flavour packages as pins (what the image's constraints file holds for them)."""
    (site,) = venv.glob("lib/python3.*/site-packages")
    lines = ["# flavour: bench (host venv)"]
    for project in PACKAGES:
        for info in site.glob(f"{project}-*.dist-info"):
            lines.append(f"{project}=={info.name[len(project) + 1:-len('.dist-info')]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(command: list[str]) -> tuple[float, dict]:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"exit {result.returncode}: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return seconds, json.loads(result.stdout)


VARIANTS = (("whole check", []), ("without the requirements", ["--no-pip-check"]),
            ("without the imports", ["--no-import"]))


def report_line(label: str, walls: list[float], report: dict) -> str:
    imports = report["imports"]
    return (f"{label}: " + ", ".join(f"{wall:.2f}" for wall in walls)
            + f" s wall (min {min(walls):.2f}, median {statistics.median(walls):.2f}); ok={report['ok']}; "
            f"{imports['exercised']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(sys.prefix))
    parser.add_argument("--image", help="time it inside this image (docker run) instead of on --venv")
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-image-check-") as scratch:
        tool = write_check_tool(Path(scratch) / "xla-images-check")
        if arguments.image:
            base = ["docker", "run", "--rm", "-e", "PJRT_DEVICE=CPU", "-v", f"{tool}:/tmp/xla-images-check:ro",
                    arguments.image, "/opt/venv/bin/python", "-IS", "/tmp/xla-images-check", "--json"]
            where = f"image {arguments.image} (docker run included)"
        else:
            constraints = constraints_for(arguments.venv, Path(scratch) / "constraints.txt")
            base = [str(arguments.venv / "bin" / "python"), "-IS", str(tool), "--venv", str(arguments.venv),
                    "--constraints", str(constraints), "--json"]
            where = f"venv {arguments.venv}"
        print(f"{where}; tool {tool.stat().st_size} bytes; load average {os.getloadavg()[0]:.2f}")
        for label, extra in VARIANTS:
            walls, report = [], {}
            for _ in range(arguments.runs):
                seconds, report = timed(base + extra)
                walls.append(seconds)
            print(report_line(label, walls, report))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
