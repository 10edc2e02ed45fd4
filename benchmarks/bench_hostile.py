#!/usr/bin/env python3
"""Wall time and peak memory of `build.py validate` on hostile inputs (target: each answered in < 3 s, < 300 MB).

    python benchmarks/bench_hostile.py

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


def main() -> None:
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
