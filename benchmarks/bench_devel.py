#!/usr/bin/env python3
"""What a devel image costs over its runtime image, and what the extension build in it takes; prints the figures.

For a flavour whose runtime and devel images are built (`build.py build TAG TAG_devel`), from the engine alone:
the runtime layers the devel image shares (they must be all of them, in order), the devel image's own layers
(unpacked bytes, from the image history) and its stored size over the runtime's (the containerd store's compressed
content). With `--rebuild`, the devel image is built again with the runtime stage cached (`--force`): the time its
devel stage takes. With `--extension`, `pip wheel .` of examples/extension in a devel container is timed.

Usage: benchmarks/bench_devel.py [TAG] [--rebuild] [--extension]     (TAG default r2.9.0_3.11_cpu)
Run it under the engine lock (`flock /tmp/xla-engine.lock ...`) when it builds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xla_images import resources  # noqa: E402
from xla_images.names import local_ref  # noqa: E402


def inspect(ref: str) -> dict:
    return json.loads(subprocess.run(["docker", "image", "inspect", ref], check=True, capture_output=True,
                                     text=True).stdout)[0]


def history(ref: str) -> list[tuple[int, str]]:
    """(unpacked bytes, the step) of each history entry that made a layer, newest first."""
    lines = subprocess.run(["docker", "image", "history", "--no-trunc", "--human=false", "--format",
                            "{{.Size}}\t{{.CreatedBy}}", ref], check=True, capture_output=True, text=True).stdout
    entries = [line.split("\t", 1) for line in lines.splitlines()]
    return [(int(size), step) for size, step in entries if int(size) > 0]


def figures(tag: str) -> None:
    runtime, devel = inspect(local_ref(tag)), inspect(local_ref(tag + "_devel"))
    shared, own = runtime["RootFS"]["Layers"], devel["RootFS"]["Layers"]
    assert own[:len(shared)] == shared, "the devel image does not start with the runtime image's layers"
    added = len(own) - len(shared)
    print(f"{tag}: runtime {len(shared)} layers, devel {len(own)} layers: all {len(shared)} shared, {added} its own")
    for size, step in history(local_ref(tag + "_devel"))[:added]:
        print(f"  devel layer {size / 1e6:8.1f} MB unpacked  {step.replace('/bin/sh -c ', '')[:90]}")
    more = devel["Size"] - runtime["Size"]
    print(f"stored size: runtime {runtime['Size'] / 1e9:.3f} GB, devel {devel['Size'] / 1e9:.3f} GB: "
          f"+{more / 1e6:.1f} MB ({100 * more / runtime['Size']:.1f} %)")


def rebuild(tag: str) -> None:
    started = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "build.py"), "build", tag + "_devel", "--force"], cwd=ROOT, check=True,
                   env={**os.environ, "CI": "true"}, capture_output=True)
    print(f"devel image rebuilt (runtime stage cached): {time.monotonic() - started:.1f} s")


def extension(tag: str) -> None:
    source = resources.extension_example_dir()
    command = ["docker", "run", "--rm", "-v", f"{source}:/src:ro", local_ref(tag + "_devel"), "sh", "-c",
               "cp -r /src /tmp/ext && cd /tmp/ext && pip wheel --no-deps -w /tmp/dist . >/dev/null && ls /tmp/dist"]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    print(f"pip wheel . of examples/extension in {tag}_devel: {time.monotonic() - started:.1f} s "
          f"({result.stdout.strip()}), load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag", nargs="?", default="r2.9.0_3.11_cpu")
    parser.add_argument("--rebuild", action="store_true", help="time the devel stage (build --force)")
    parser.add_argument("--extension", action="store_true", help="time `pip wheel .` of examples/extension")
    options = parser.parse_args()
    if options.rebuild:
        rebuild(options.tag)
    figures(options.tag)
    if options.extension:
        extension(options.tag)


if __name__ == "__main__":
    main()
