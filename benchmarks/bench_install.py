#!/usr/bin/env python3
"""The wheels stage's install: one `pip install -r requirements.lock` against install_wheels.py, side by side in
one run. Prints figures; asserts nothing.

    python benchmarks/bench_install.py [TAG ...] [--rounds N]

For each TAG (default r2.9.0_3.11_cpu) the flavour's build context is written as `build` writes it (lock,
scripts, the site's pip settings and CA), then a container of the flavour's base image does what the wheels stage
does: a bare venv, ensurepip, then either
  one-step   `install_wheels.py --jobs 1`: `pip install --require-hashes -r requirements.lock` alone (before)
  parallel   `install_wheels.py` (now: pips in parallel, then the one-step install as the check)
with the page cache dropped before each and the order alternating per round; the wheels come from the site's
index every time (no pip cache), as in a cold build. The two venvs are then compared file for file (sha256 of
every file, and each symlink's target): the line says whether they are equal.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.names import (IMAGE_PIP_DIR, IMAGE_WHEELHOUSE, INSTALL_SCRIPT, INSTALL_WORK, LOCK_NAME,  # noqa: E402
                              SOURCE_DATE_EPOCH, VENV)
from xla_images.run.building import context as build_context
from xla_images.run.building.build import choose_base

# Mode -> the installer's --jobs: 1 is the one-step `pip install -r requirements.lock` alone; 0, the build's.
MODES = {"one-step": 1, "parallel": 0}
SCRIPT = """set -e
export SOURCE_DATE_EPOCH={epoch} PYTHONHASHSEED=0
python{python} -m venv --without-pip {venv}
{venv}/bin/python{python} -m ensurepip --upgrade --default-pip >/dev/null
export PIP_CONFIG_FILE={pip_dir}/pip.conf
start=$(date +%s%N)
{venv}/bin/python /ctx/{script} --lock /ctx/{lock} --work {work} --jobs "$JOBS"
end=$(date +%s%N)
echo "INSTALL_MS $(( (end - start) / 1000000 ))"
cd {venv} && find . -type f -print0 | sort -z | xargs -0 sha256sum > /out/$MODE.txt
find . -type l -printf '%p -> %l\\n' | sort >> /out/$MODE.txt
"""


def drop_page_cache() -> bool:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def run_install(mode: str, base: str, python: str, context: Path, out: Path) -> tuple[float, list[str]]:
    """(seconds pip took, installer summary lines) of one install in a fresh container."""
    secrets = build_context.secrets_dir_for(context)
    script = SCRIPT.format(epoch=SOURCE_DATE_EPOCH, python=python, venv=VENV, pip_dir=IMAGE_PIP_DIR,
                           lock=LOCK_NAME, script=INSTALL_SCRIPT, work=INSTALL_WORK)
    command = ["docker", "run", "--rm", "-e", f"MODE={mode}", "-e", f"JOBS={MODES[mode]}",
               "-v", f"{context}:/ctx:ro", "-v", f"{context / 'wheelhouse'}:{IMAGE_WHEELHOUSE}:ro",
               "-v", f"{secrets}:{IMAGE_PIP_DIR}:ro", "-v", f"{out}:/out", base, "bash", "-c", script]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{mode} install failed after {time.monotonic() - started:.0f} s:\n{result.stdout[-3000:]}"
                 f"{result.stderr[-3000:]}")
    seconds = next(int(line.split()[1]) / 1000 for line in result.stdout.splitlines()
                   if line.startswith("INSTALL_MS "))
    summary = [line for line in result.stdout.splitlines() if line.startswith("install_wheels:")]
    return seconds, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tags", nargs="*", default=["r2.9.0_3.11_cpu"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--matrix", type=Path, default=Path(__file__).resolve().parents[1] / "matrix.yaml")
    args = parser.parse_args()
    plan = load_plan(args.matrix)
    rows = []
    for flavour in plan.select(tuple(args.tags)):
        base = choose_base(flavour.python, flavour.base_image)
        with tempfile.TemporaryDirectory(prefix="bench-install-") as scratch:
            context = Path(scratch) / "context"
            context.mkdir()
            build_context.write_context(plan, flavour, context)
            out = Path(scratch) / "out"
            out.mkdir()
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for number in range(args.rounds):
                order = list(MODES) if number % 2 == 0 else list(MODES)[::-1]
                for mode in order:
                    cold = drop_page_cache()
                    seconds, summary = run_install(mode, base, flavour.python, context, out)
                    times[mode].append(seconds)
                    print(f"  {flavour.tag} round {number + 1} {mode:9} {seconds:6.1f} s"
                          f"{'' if cold else ' (page cache not dropped: not root)'}", file=sys.stderr)
                    for line in summary:
                        print(f"      {line}", file=sys.stderr)
            same = (out / "one-step.txt").read_bytes() == (out / "parallel.txt").read_bytes()
            files = len((out / "parallel.txt").read_text().splitlines())
            rows.append((flavour.tag, statistics.median(times["one-step"]), statistics.median(times["parallel"]),
                         f"{'same' if same else 'DIFFERENT'} ({files} files)"))
    print(f"{'flavour':24} {'one-step':>9} {'parallel':>9} {'ratio':>6}  venvs")
    for tag, one_step, parallel, verdict in rows:
        print(f"{tag:24} {one_step:8.1f}s {parallel:8.1f}s {parallel / one_step:6.2f}  {verdict}")


if __name__ == "__main__":
    main()
