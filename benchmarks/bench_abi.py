#!/usr/bin/env python3
"""How long `abi inspect` / `abi check` take on real torch binaries. Prints figures; asserts nothing.

    python benchmarks/bench_abi.py [--repeat N] [--torch-wheel PATH] [--tiny N] [--version-needs N]

Targets: `abi inspect` of the torch_xla 2.9.0 wheel under 10 s; `abi check` of torch 2.9's site-packages under 3 s.
--tiny N times inspect and check of a tree of N tiny C libraries beside a stand-in torch (issue 35: per-file
overhead), --version-needs N reading a library with N version-need records (issue 35: the walk was quadratic). Wheels come from $XLA_IMAGES_TEST_WHEELS
(default ~/.cache/xla-images/test-wheels, shared with tests/xla); the torch_xla one is downloaded if missing.
The torch wheel (~900 MB) is not downloaded: pass --torch-wheel or put torch-*.whl in that directory; without
one, the installed torch's torch/lib directory is timed instead. `abi check` is timed on the site-packages of
the python running this script when it holds torch.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xla_images import abi  # noqa: E402

WHEELS = Path(os.environ.get("XLA_IMAGES_TEST_WHEELS", Path.home() / ".cache" / "xla-images" / "test-wheels"))
TORCH_XLA = "2.9.0"
TARGET_SECONDS = 10.0


def torch_xla_wheel() -> Path:
    pattern = f"torch_xla-{TORCH_XLA}-cp311-cp311-manylinux*_x86_64.whl"
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--platform",
                        "manylinux_2_28_x86_64", "-d", str(WHEELS), f"torch_xla=={TORCH_XLA}"], check=True)
        found = sorted(WHEELS.glob(pattern))
    return found[0]


def timed(label: str, action: Callable[[], object], repeat: int, target: float | None = None) -> None:
    durations, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = action()
        durations.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    best, worst = min(durations), max(durations)
    goal = f" (target < {target:.0f} s: {'met' if worst < target else 'MISSED'})" if target else ""
    # CPU time shows the cost when other jobs share the machine; the load average says how much they did.
    print(f"{label}: best {best:.2f} s, worst {worst:.2f} s wall, {min(cpu):.2f} s CPU, over {repeat} run(s)"
          f"{goal}; load average {os.getloadavg()[0]:.1f}")
    print(f"    -> {describe(result)}")


def describe(result: object) -> str:
    if isinstance(result, abi.PackageReport):
        return f"abi={result.abi}, {len(result.shared_objects)} shared objects, {result.verdict}"
    if isinstance(result, abi.CheckReport):
        return result.summary
    return repr(result)


def tiny_tree(root: Path, count: int) -> Path:
    """count distinct tiny C libraries in 100 folders, and torch/lib/libtorch.so (a tiny C++ one)."""
    source = root / "tiny.c"
    source.write_text("int tiny_value(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(root / "tiny.so")], check=True)
    (root / "tree" / "torch" / "lib").mkdir(parents=True)
    (root / "torch.cpp").write_text("namespace c10 { int torch_value() { return 2; } }\n")
    subprocess.run(["g++", "-shared", "-fPIC", str(root / "torch.cpp"), "-o",
                    str(root / "tree" / "torch" / "lib" / "libtorch.so")], check=True)
    data = (root / "tiny.so").read_bytes()
    for number in range(count):
        folder = root / "tree" / f"d{number % 100}"
        folder.mkdir(exist_ok=True)
        (folder / f"lib{number}.so").write_bytes(data)
    return root / "tree"


def needs_library(root: Path, count: int) -> Path:
    """A tiny C library whose version-need table holds count records (tests/unit/test_abi_hostile.py's shape)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
    from elf_mutations import with_version_needs  # noqa: E402 (the hostile tests' builder: one definition)
    (root / "needs.c").write_text("#include <stdio.h>\nint say(void) { return puts(\"x\"); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(root / "needs.c"), "-o", str(root / "seed.so")], check=True)
    library = root / "libneeds.so"
    library.write_bytes(with_version_needs((root / "seed.so").read_bytes(), count))
    return library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torch-wheel", type=Path, help="a torch wheel to time (default: torch-*.whl in the cache)")
    parser.add_argument("--tiny", type=int, help="time only a tree of this many tiny libraries")
    parser.add_argument("--version-needs", type=int, help="time only a library with this many version needs")
    arguments = parser.parse_args()
    if arguments.tiny or arguments.version_needs:
        with tempfile.TemporaryDirectory(prefix="bench-abi-") as scratch:
            if arguments.tiny:
                tree = tiny_tree(Path(scratch), arguments.tiny)
                timed(f"abi inspect of {arguments.tiny} tiny libraries", lambda: abi.inspect_path(tree),
                      arguments.repeat)
                timed(f"abi check of {arguments.tiny} tiny libraries", lambda: abi.check_site_packages(tree),
                      arguments.repeat)
            if arguments.version_needs:
                library = needs_library(Path(scratch), arguments.version_needs)
                timed(f"abi inspect of a library with {arguments.version_needs} version needs",
                      lambda: abi.inspect_path(library), arguments.repeat)
        return

    wheel = torch_xla_wheel()
    size = wheel.stat().st_size / 1e6
    timed(f"abi inspect {wheel.name} ({size:.0f} MB)", lambda: abi.inspect_path(wheel), arguments.repeat,
          TARGET_SECONDS)

    torch_wheel = arguments.torch_wheel or next(iter(sorted(WHEELS.glob("torch-*.whl"))), None)
    spec = importlib.util.find_spec("torch")
    site = Path(spec.origin).parent.parent if spec and spec.origin else None
    if torch_wheel is not None:
        size = torch_wheel.stat().st_size / 1e6
        timed(f"abi inspect {torch_wheel.name} ({size:.0f} MB)", lambda: abi.inspect_path(torch_wheel),
              arguments.repeat)
    elif site is not None:
        timed(f"abi inspect {site / 'torch' / 'lib'} (installed torch's libraries)",
              lambda: abi.inspect_path(site / "torch" / "lib"), arguments.repeat)
    else:
        print("no torch wheel in the cache and no torch installed: torch libraries not timed")
    if site is not None:
        timed(f"abi check {site}", lambda: abi.check_site_packages(site), arguments.repeat, TARGET_SECONDS)


if __name__ == "__main__":
    main()
