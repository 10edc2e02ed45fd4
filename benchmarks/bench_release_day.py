#!/usr/bin/env python3
"""Release day, measured: the whole matrix through `ci/main-job.sh all` from a fresh clone, then again (a no-op).
Prints figures; asserts nothing. Run it ALONE (no CI, no other builds): it takes about an hour, and the disk
holds up to two images, the build cache of one release+python and the registry's new blobs at once.

    python benchmarks/bench_release_day.py [--registry HOST:PORT/REPO] [--clone DIR] [--engines "default ctx2"]
                                           [--images TAG ...] [--output FILE.json]

Figures: wall time of each run; per phase (build, test, push) the seconds summed and per image; images pushed,
held and blocked (with why); peak disk above the idle level (sampled every 2 s, the registry's storage
included: it is on the same disk here); bytes pushed; the registry's storage growth over the sum of the image
sizes; that every pushed image resolves to the digest recorded; the second run's wall time.
With --engines the run is split across those engines (ENGINES of ci/main-job.sh); --images limits the run to
those tags (a subset, e.g. to compare a split run with a one-engine run of the same images: same digests).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("XLA_IMAGES_STATE", "/var/lib/xla-images"))
SAMPLE_SECONDS = 2.0
FACTS = ("python", "torch_xla", "accelerator", "abi", "variant")
FILTER_OPTIONS = {"python": "--python", "torch_xla": "--torch-xla", "accelerator": "--accelerator", "abi": "--abi",
                  "variant": "--variant"}


class DiskPeak:
    """The most bytes used on the disk under `path` while it runs, sampled every SAMPLE_SECONDS."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.idle = shutil.disk_usage(path).used
        self.peak = self.idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, shutil.disk_usage(self.path).used)

    def __enter__(self) -> "DiskPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def tree_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    answer = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, timeout=600)
    return int(answer.stdout.split()[0]) if answer.returncode == 0 and answer.stdout else 0


def main_job(clone: Path, registry: str, engines: str | None, images: list[str], log: Path) -> tuple[float, int]:
    environment = {**os.environ, "REGISTRY": registry, "CI": "true"}
    if engines:
        environment["ENGINES"] = engines
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as output:
        code = subprocess.run(["bash", "ci/main-job.sh", *(images or ["all"])], cwd=clone, env=environment,
                              stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT).returncode
    return time.monotonic() - started, code


def resolves(clone: Path, published: dict) -> tuple[int, list[str]]:
    """Each recorded image resolved by its facts from the registry itself: the ref must be the recorded one."""
    good, bad = 0, []
    for tag, entry in published.items():
        # A runtime image's record names no variant: `variant` appears on devel images only.
        facts = {"variant": "runtime", **entry["flavour"]}
        options = [item for fact in FACTS for item in (FILTER_OPTIONS[fact], str(facts[fact]))]
        registry = entry["registry"]
        answer = subprocess.run([str(clone / ".venv/bin/python"), "build.py", "resolve", "--registry", registry,
                                 *options], cwd=clone, capture_output=True, text=True, timeout=300)
        if answer.returncode == 0 and answer.stdout.strip() == entry["ref"]:
            good += 1
        else:
            bad.append(f"{tag}: {answer.stdout.strip() or answer.stderr.strip()[-200:]}")
    return good, bad


STEP = re.compile(r"^#(\d+) \[(.*?)\] (.*)$")
DONE = re.compile(r"^#(\d+) DONE ([0-9.]+)s$")
EXPORTED = re.compile(r"^#\d+ exporting layers ([0-9.]+)s done$")
BUILT = re.compile(r"^built in ([0-9.]+) s$")


def build_floor(log: Path) -> tuple[float, float] | None:
    """(build seconds, floor seconds) from a runtime image's build.log: the floor is what cannot go faster here,
    the wheels stage's download + install (one pip step) plus the layers' compression (`exporting layers`)."""
    if not log.is_file():
        return None
    steps, install, export, total = {}, 0.0, 0.0, 0.0
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if found := STEP.match(line):
            steps[found.group(1)] = found.group(3)
        elif (found := DONE.match(line)) and "install_wheels.py" in steps.get(found.group(1), ""):
            install = float(found.group(2))
        elif found := EXPORTED.match(line):
            export = float(found.group(1))
        elif found := BUILT.match(line):
            total = float(found.group(1))
    return (total, install + export) if total and install else None


def floors(clone: Path, report: dict) -> None:
    print(f"   {'runtime image':<30} {'build':>6} {'floor':>6} {'ratio':>6}   (floor: pip download+install + compression)")
    for item in report["flavours"]:
        found = build_floor(clone / "reports" / item["tag"] / "build.log") if item["variant"] == "runtime" else None
        if found and "build" in item["phases"]:
            total, floor = found
            print(f"   {item['tag']:<30} {total:6.0f} {floor:6.0f} {total / floor:6.2f}")


def phase_totals(report: dict) -> dict[str, float]:
    totals = {"build": 0.0, "test": 0.0, "push": 0.0}
    for item in report["flavours"]:
        for name, phase in item["phases"].items():
            totals[name] = totals.get(name, 0.0) + float(phase["seconds"])
    return totals


def describe(run: str, seconds: float, code: int, report: dict) -> None:
    print(f"\n== {run}: {seconds:.0f} s wall ({seconds / 60:.1f} min), exit {code}")
    print("   " + ", ".join(f"{count} {result}" for result, count in report["counts"].items() if count))
    totals = phase_totals(report)
    print("   phases summed: " + ", ".join(f"{name} {value:.0f} s" for name, value in totals.items()))
    print(f"   bytes built {report['bytes_built'] / 1e9:.1f} GB, pushed {report['bytes_pushed'] / 1e9:.1f} GB")
    print(f"   {'image':<30} {'result':<8} {'build':>6} {'test':>6} {'push':>6} {'GB':>6}  note")
    for item in report["flavours"]:
        phases = item["phases"]
        cells = [f"{phases[name]['seconds']:6.0f}" if name in phases else f"{'-':>6}" for name in ("build", "test", "push")]
        size = phases.get("build", {}).get("bytes", 0) / 1e9
        note = item["reason"] if item["result"] != "pushed" else ""
        print(f"   {item['tag']:<30} {item['result']:<8} {' '.join(cells)} {size:6.2f}  {note[:90]}")


def run(args: argparse.Namespace) -> dict:
    clone = Path(args.clone)
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=600)
    storage = STATE / "registry" / args.registry.split("/")[0].rpartition(":")[2]
    figures: dict = {"registry": args.registry, "engines": args.engines, "images": args.images}
    storage_before = tree_bytes(storage)
    with DiskPeak(Path("/")) as disk:
        seconds, code = main_job(clone, args.registry, args.engines, args.images, clone.parent / "release-day-1.log")
    report = json.loads((clone / "reports" / "pipeline.json").read_text(encoding="utf-8"))
    describe("first run", seconds, code, report)
    floors(clone, report)
    grown = tree_bytes(storage) - storage_before
    image_bytes = report["bytes_built"]
    published = json.loads((clone / "published.json").read_text(encoding="utf-8"))["flavours"] \
        if (clone / "published.json").is_file() else {}
    print(f"   peak disk above idle {(disk.peak - disk.idle) / 1e9:.1f} GB (idle {disk.idle / 1e9:.1f} GB used)")
    print(f"   registry storage grew {grown / 1e9:.1f} GB = {grown / image_bytes if image_bytes else 0:.2f} of the "
          f"sum of image sizes ({image_bytes / 1e9:.1f} GB)", flush=True)
    good, bad = resolves(clone, published)
    print(f"   resolve: {good} of {len(published)} recorded images resolve to their recorded digest" +
          ("" if not bad else "; not: " + "; ".join(bad)))
    figures["first"] = {"seconds": seconds, "exit": code, "report": report, "peak_disk_above_idle": disk.peak - disk.idle,
                        "registry_growth": grown, "resolved": good, "not_resolved": bad,
                        "digests": {tag: entry["digest"] for tag, entry in published.items()}}
    if not args.no_rerun:
        seconds, code = main_job(clone, args.registry, args.engines, args.images, clone.parent / "release-day-2.log")
        rerun = json.loads((clone / "reports" / "pipeline.json").read_text(encoding="utf-8"))
        describe("second run (nothing changed)", seconds, code, rerun)
        figures["second"] = {"seconds": seconds, "exit": code, "report": rerun}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", default=f"127.0.0.1:5000/release-day-{time.strftime('%Y%m%d%H%M%S')}")
    parser.add_argument("--clone", default="/tmp/xla-images-release-day/clone")
    parser.add_argument("--engines", default=None)
    parser.add_argument("--images", nargs="*", default=[])
    parser.add_argument("--no-rerun", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    figures = run(args)
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"\nfigures in {args.output}")


if __name__ == "__main__":
    sys.exit(main())
