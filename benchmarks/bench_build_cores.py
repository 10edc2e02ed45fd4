#!/usr/bin/env python3
"""A cold build's phases with the engine held to fewer cores than the machine has, side by side in one run.
Prints figures; asserts nothing. Run as root (it sets the engine's CPU affinity and drops the page cache).

    python benchmarks/bench_build_cores.py [TAG] [--rounds N] [--cores 2,1]

What it answers: how much of a build's time would more cores take away. This machine has two, so the benchmark
holds the engine to one and to two, and fits the two points: on either image store, how much of each phase is
bound by the CPU (on the containerd store: of BuildKit's export of the layers as zstd and of its unpack).

Each round builds TAG (default r2.9.0_3.11_cpu) once per core count, the order alternating per round, with
`build.py build TAG --force --prune-cache` (every step again, the wheels from the index). Before each build the
flavour's images (under every name) and the build cache are removed and the page cache is dropped. For the build, the engine (the one
dockerd on this machine, the containerd it started, every thread of both) is held to the first N cores with
sched_setaffinity; the steps' containers, started by that containerd, inherit it. After the build, and if the
benchmark stops early, the engine gets back the cores it had.

Phases, read from reports/TAG/build.log: the wheels stage's install (the RUN step with the installer), BuildKit's
export of the layers, its unpack into the image store (containerd store only), and the whole build.

With two core counts each phase is fitted to t(n) = serial + parallel / n (Amdahl's law) and t is printed for 4,
8 and 16 cores: a model drawn through two points, not a measurement.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images.names import INSTALL_SCRIPT, REPORTS, TAG_LABEL  # noqa: E402
from xla_images.run import engine  # noqa: E402

# Phases a line of the log names; the install is found by its step number (phase_seconds).
LINE_PHASES = {
    "export": re.compile(r"^#\d+ exporting layers ([0-9.]+)s done$"),
    "unpack": re.compile(r"^#\d+ unpacking to \S+ ([0-9.]+)s done$"),
    "build": re.compile(r"built in ([0-9.]+) s\b"),
}
PHASES = ("install", *LINE_PHASES)
STEP_HEADER = re.compile(r"^#(\d+) \[wheels \d+/\d+\] RUN ")
PROJECTED_CORES = (4, 8, 16)


def engine_pids() -> list[int]:
    """The one dockerd and its children (the containerd it started)."""
    found = subprocess.run(["pgrep", "-x", "dockerd"], text=True, capture_output=True).stdout.split()
    if not found:
        raise SystemExit("no dockerd is running: start the engine (ci/engine.sh start)")
    if len(found) > 1:
        raise SystemExit(f"{len(found)} dockerds are running (pids {', '.join(found)}): the benchmark holds one "
                         "engine to fewer cores; stop the others first")
    dockerd = int(found[0])
    children = subprocess.run(["pgrep", "-P", str(dockerd)], text=True, capture_output=True).stdout.split()
    return [dockerd, *map(int, children)]


def threads(pid: int) -> list[int]:
    return [int(task) for task in os.listdir(f"/proc/{pid}/task")]


def set_affinity(pids: list[int], cores: set[int]) -> None:
    for pid in pids:
        for thread in threads(pid):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread, cores)


@contextlib.contextmanager
def engine_on(count: int) -> Iterator[None]:
    pids = engine_pids()
    had = os.sched_getaffinity(pids[0])
    set_affinity(pids, set(sorted(had)[:count]))
    try:
        yield
    finally:
        set_affinity(pids, had)


def remove_images(tag: str) -> None:
    """Every image of the flavour, under all its names: an alias left behind would keep the layers unpacked
    (the containerd store would then skip the unpack)."""
    for image in engine.images.images_labelled({TAG_LABEL: tag}):
        engine.images.remove_image(image["Id"], force=True)


def make_cold(tag: str) -> None:
    remove_images(tag)
    engine.builds.prune_build_cache()
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def phase_seconds(log: str) -> dict[str, float]:
    found: dict[str, float] = {}
    lines = log.splitlines()
    install_step = next((match.group(1) for line in lines if (match := STEP_HEADER.match(line))
                         and INSTALL_SCRIPT in line), None)
    for line in lines:
        if install_step and (done := re.match(rf"^#{install_step} DONE ([0-9.]+)s$", line)):
            found["install"] = float(done.group(1))
        for phase, pattern in LINE_PHASES.items():
            if match := pattern.search(line):
                found[phase] = float(match.group(1))
    return found


def build_once(tag: str, cores: int) -> dict[str, float]:
    make_cold(tag)
    with engine_on(cores):
        done = subprocess.run([sys.executable, str(REPO / "build.py"), "build", "--force", "--prune-cache", tag],
                              cwd=REPO, text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"build {tag} on {cores} core(s) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    phases = phase_seconds((REPO / REPORTS / tag / "build.log").read_text(encoding="utf-8", errors="replace"))
    print(f"  {cores} core(s): " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()),
          flush=True)
    return phases


def report(results: dict[int, list[dict[str, float]]]) -> None:
    counts = sorted(results)
    print("\nphase      " + "".join(f"{f'{count} core(s)':>24}" for count in counts))
    medians: dict[int, dict[str, float]] = {}
    for count in counts:
        medians[count] = {phase: statistics.median(run[phase] for run in results[count])
                          for phase in PHASES if all(phase in run for run in results[count])}
    for phase in PHASES:
        cells = []
        for count in counts:
            if phase not in medians[count]:
                cells.append(f"{'-':>24}")
                continue
            runs = ", ".join(f"{run[phase]:.1f}" for run in results[count])
            cells.append(f"{medians[count][phase]:>8.1f} ({runs})".rjust(24))
        print(f"{phase:<11}" + "".join(cells))
    if len(counts) == 2:
        print_fit(counts, medians)


def print_fit(counts: list[int], medians: dict[int, dict[str, float]]) -> None:
    few, many = counts
    print(f"\nfit t(n) = serial + parallel/n through the medians at {few} and {many} cores (a model, not measured):")
    print(f"{'phase':<11}{'serial':>9}{'parallel':>10}" + "".join(f"{f't({n})':>9}" for n in PROJECTED_CORES))
    for phase in PHASES:
        if phase not in medians[few] or phase not in medians[many]:
            continue
        slow, fast = medians[few][phase], medians[many][phase]
        parallel = (slow - fast) / (1 / few - 1 / many)
        serial = slow - parallel / few
        print(f"{phase:<11}{serial:>9.1f}{parallel:>10.1f}"
              + "".join(f"{serial + parallel / n:>9.1f}" for n in PROJECTED_CORES))


def parse_cores(text: str, available: int) -> list[int]:
    try:
        counts = [int(count) for count in text.split(",")]
    except ValueError:
        raise SystemExit(f"--cores {text!r}: give core counts separated by commas, e.g. 2,1") from None
    if any(not 1 <= count <= available for count in counts) or len(set(counts)) != len(counts):
        raise SystemExit(f"--cores {text!r}: each count once, between 1 and the engine's {available} core(s)")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tag", nargs="?", default="r2.9.0_3.11_cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cores", default="2,1", help="core counts to hold the engine to (default 2,1)")
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: at least 1")
    if os.geteuid() != 0:
        raise SystemExit("run as root: it sets the engine's CPU affinity and drops the page cache")
    available = len(os.sched_getaffinity(engine_pids()[0]))
    counts = parse_cores(args.cores, available)
    store = engine.connection.image_store()
    print(f"{args.tag}: {args.rounds} round(s), {store} image store, cores {counts}", flush=True)
    results: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
    for round_number in range(args.rounds):
        print(f"round {round_number + 1}", flush=True)
        order = counts if round_number % 2 == 0 else counts[::-1]
        for count in order:
            results[count].append(build_once(args.tag, count))
    remove_images(args.tag)
    engine.builds.prune_build_cache()
    report(results)


if __name__ == "__main__":
    main()
