#!/usr/bin/env python3
"""Wall time and peak memory of `build.py validate` on hostile inputs (target: each answered in < 3 s, < 300 MB).

    python benchmarks/bench_hostile.py
    python benchmarks/bench_hostile.py --shapes                 # every file-system shape at every place, timed
    python benchmarks/bench_hostile.py --random 300 [--seed N]  # random shape combinations for 300 s

--shapes times each command on each shape of tests/unit/fs_shapes.py (the enumerated table the unit test runs
in-process) in a subprocess. --random is the exploration CI does not do: it plants one to three random shapes at
random places of a fresh checkout, runs a random command, and reports every case that broke a promise (a
traceback, an exit code other than 0/1/2/130, more than SLOW seconds or PEAK_MB, a change outside the
checkout, a temporary file left) with the seed to replay it; it prints what it found and asserts nothing.

Every case runs in a fresh subprocess (so the figure includes importing the CLI, ~0.5 s) and prints its exit
code, the rule it was refused with, wall seconds and the child's peak RSS. The baseline row is the committed
matrix. Prints figures, asserts nothing; tests/unit/test_hostile_inputs.py holds the same cases as tests.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = (ROOT / "matrix.yaml").read_text()
BOMB = "".join(f"{name}: &{name} [{', '.join([item] * 9)}]\n"
               for item, name in zip(['"lol"', *(f"*{prev}" for prev in "abcdefgh")], "abcdefghi"))
CASES = {
    "baseline (committed matrix)": MATRIX,
    "alias bomb (9**9 values)": BOMB,
    "alias cycle": "a: &a\n  b: *a\n",
    "5000 nested lists": "[" * 5000 + "]" * 5000,
    "100 000-character tag": "schema: !" + "t" * 100_000 + " 1\n",
    "200 000-character value": MATRIX.replace("pytorch_git_rev: v2.9.1", "pytorch_git_rev: " + "a" * 200_000),
    "990 pythons (4000 flavours)": MATRIX.replace('["3.9", "3.10", "3.11", "3.12", "3.13"]',
                                   "[" + ", ".join(f'"3.{minor}"' for minor in range(9, 999)) + "]"),
    "250 KiB of comments": "#" * 99 + "\n" * 1 + ("# " + "x" * 97 + "\n") * 2500 + MATRIX,
}


def run(path: str) -> tuple[int, str, float, float]:
    """Exit code, rule, wall seconds and peak RSS (MB) of one `validate` child, measured by wait4."""
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, str(ROOT / "build.py"), "validate", "--matrix", path],
                                 stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
        stderr.seek(0)
        rule = re.search(r"error \[([a-z0-9-]+)\]", stderr.read().decode(errors="replace"))
    return child.returncode, rule.group(1) if rule else "-", seconds, usage.ru_maxrss / 1024


SLOW = 5.0
SLOW_LINT = 30.0  # lint runs hadolint and shellcheck over every rendered file: seconds even on a clean tree
PEAK_MB = 300
COMMANDS = (("render",), ("render", "--check"), ("ci", "github", "--check"), ("ci", "bake", "--check"),
            ("list", "--json"), ("validate",), ("lint",))


def run_command(args: list[str], cwd: Path) -> tuple[int, str, float, float]:
    """Exit code, stderr, wall seconds and peak RSS (MB) of one build.py child (killed after 60 s: a hang)."""
    import threading
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, stdout=subprocess.DEVNULL,
                                 stderr=stderr, env={**os.environ, "PYTHONPATH": str(ROOT)})
        killer = threading.Timer(60, child.kill)
        killer.start()
        _, status, usage = os.wait4(child.pid, 0)
        killer.cancel()
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
        stderr.seek(0)
        return child.returncode, stderr.read().decode(errors="replace"), seconds, usage.ru_maxrss / 1024


def broken(code: int, err: str, seconds: float, peak: float, outside_changed: bool, temps: list[str],
           slow: float = SLOW) -> list[str]:
    problems = []
    if "Traceback" in err:
        problems.append("traceback: " + err.strip().splitlines()[-1][:120])
    if code not in (0, 1, 2, 130):
        problems.append(f"exit {code}")
    if seconds > slow:
        problems.append(f"{seconds:.1f} s")
    if peak > PEAK_MB:
        problems.append(f"{peak:.0f} MB")
    if outside_changed:
        problems.append("changed what lies outside the checkout")
    if temps:
        problems.append(f"left {temps}")
    return problems


def shapes_table() -> None:
    """Every shape at every place, `render` then `render --check`, each in a subprocess: time and peak memory."""
    import fs_shapes
    print(f"{'place':20} {'shape':20} {'render':>14} {'render --check':>16} {'seconds':>8} {'peak MB':>8}")
    for place in sorted(fs_shapes.PLACES):
        for shape in sorted(fs_shapes.SHAPES):
            with tempfile.TemporaryDirectory() as folder:
                checkout = fs_shapes.make_checkout(Path(folder))
                planted = fs_shapes.plant(checkout, place, shape)
                outside = fs_shapes.snapshot(checkout.outside)
                answers, worst, peak, problems = [], 0.0, 0.0, []
                for command in (("render",), ("render", "--check")):
                    code, err, seconds, used = run_command([*command, "--matrix", str(checkout.matrix)],
                                                           checkout.root)
                    rule = re.search(r"error \[([a-z0-9-]+)\]", err)
                    answers.append(f"{code} {rule.group(1) if rule else ''}".strip())
                    worst, peak = max(worst, seconds), max(peak, used)
                    problems += broken(code, err, seconds, used, fs_shapes.snapshot(checkout.outside) != outside,
                                       fs_shapes.leftovers(checkout.root, planted))
                fs_shapes.unplant(planted)
            print(f"{place:20} {shape:20} {answers[0]:>14} {answers[1]:>16} {worst:8.2f} {peak:8.0f}"
                  + (f"  BROKEN: {'; '.join(problems)}" if problems else ""))


def random_exploration(budget: float, seed: int) -> None:
    import random

    import fs_shapes
    chooser = random.Random(seed)
    deadline = time.monotonic() + budget
    cases = 0
    found: list[str] = []
    while time.monotonic() < deadline:
        case_seed = chooser.randrange(1 << 30)
        rng = random.Random(case_seed)
        planted_places = rng.sample(sorted(fs_shapes.PLACES), rng.randint(1, 3))
        shapes = [rng.choice(sorted(fs_shapes.SHAPES)) for _ in planted_places]
        command = list(rng.choice(COMMANDS))
        with tempfile.TemporaryDirectory() as folder:
            checkout = fs_shapes.make_checkout(Path(folder))
            planted = []
            for place, shape in zip(planted_places, shapes):
                try:
                    planted.append(fs_shapes.plant(checkout, place, shape))
                except OSError:
                    continue  # a place under an earlier shape (a file where its folder was): not plantable
            outside = fs_shapes.snapshot(checkout.outside)
            code, err, seconds, peak = run_command([*command, "--matrix", str(checkout.matrix)], checkout.root)
            temps = [path for path in fs_shapes.leftovers(checkout.root) if Path(path) not in planted]
            problems = broken(code, err, seconds, peak, fs_shapes.snapshot(checkout.outside) != outside, temps,
                              SLOW_LINT if command == ["lint"] else SLOW)
            for path in planted:
                fs_shapes.unplant(path)
        cases += 1
        if problems:
            line = (f"seed {case_seed}: {' '.join(command)} with "
                    f"{', '.join(f'{p}={s}' for p, s in zip(planted_places, shapes))}: {'; '.join(problems)}")
            found.append(line)
            print("BROKEN " + line, flush=True)
    print(f"{cases} random cases in {budget:.0f} s (seed {seed}): {len(found)} broke a promise")


def main() -> None:
    if "--shapes" in sys.argv or "--random" in sys.argv:
        sys.path.insert(0, str(ROOT / "tests" / "unit"))
        if "--shapes" in sys.argv:
            shapes_table()
        else:
            budget = float(sys.argv[sys.argv.index("--random") + 1])
            seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else int(time.time())
            random_exploration(budget, seed)
        return
    print(f"{'case':32} {'exit':>4} {'rule':18} {'seconds':>8} {'peak MB':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for name, text in CASES.items():
            path = Path(folder) / "matrix.yaml"
            path.write_text(text)
            code, rule, seconds, peak = run(str(path))
            print(f"{name:32} {code:>4} {rule:18} {seconds:8.2f} {peak:8.0f}")
        fifo = Path(folder) / "fifo"
        os.mkfifo(fifo)
        for name, path in (("a fifo", str(fifo)), ("/dev/zero", "/dev/zero"), ("a directory", folder)):
            code, rule, seconds, peak = run(path)
            print(f"{name:32} {code:>4} {rule:18} {seconds:8.2f} {peak:8.0f}")


if __name__ == "__main__":
    main()
