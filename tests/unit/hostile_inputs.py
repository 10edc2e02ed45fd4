"""Running the real CLI on hostile input, and judging the answer.

The promise every command keeps, whatever arrives: exit 0, or exit 2 with `file[:line]: error [rule]` on
stderr; never a traceback. `run_cli` runs `xla_images.cli.main` in-process (fast enough for a fuzz);
`run_limited` runs build.py in a subprocess under an address-space and CPU-time limit, which proves memory
and time are bounded (a bomb that were built would hit the limit and die, not answer).
"""
from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from xla_images.cli import main

ROOT = Path(__file__).resolve().parents[2]
# A frozen matrix (today's, at the time it was copied) and one of its locks: hostile inputs are edits of a
# realistic text, and must not change when the committed matrix gains or loses a release.
FIXTURE_MATRIX = ROOT / "tests" / "fixtures" / "matrix" / "matrix.yaml"
FIXTURE_LOCK = ROOT / "tests" / "fixtures" / "matrix" / "r2.9.0_3.11_cpu.requirements.lock"
# `path[:line[:column]]: error [rule]: message` -- the first line of every rendered error (a Failure about no
# file, such as "nothing matches", has no location).
ERROR_LINE = re.compile(r"^(?:(?P<location>.+?): )?error \[(?P<rule>[a-z0-9-]+)\]: \S", re.MULTILINE)
LOCATED = re.compile(r":(?P<line>\d+)(:\d+)?$")
# Rules about the file as a whole (it is a directory, too big, ...): these need no line.
WHOLE_FILE_RULES = {"file-exists", "file-readable", "file-type", "file-size", "yaml-size", "disk-symlink", "disk-type",
                    "disk-outside"}
MEMORY_LIMIT = 1024 * 1024 * 1024  # address space of a limited run; importing the CLI takes ~250 MB of it
CPU_LIMIT = 20  # seconds of CPU time; a bounded answer needs well under one
ANSWER_SECONDS = 60  # wall time an in-process command may take before it counts as hanging (answers take < 1 s)


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def rules(self) -> list[str]:
        return [match.group("rule") for match in ERROR_LINE.finditer(self.err)]


class NoAnswer(Exception):
    """The command did not answer within ANSWER_SECONDS: a hang (a fifo opened, /dev/zero read...)."""


def _no_answer(signum: int, frame: object) -> None:
    raise NoAnswer(f"no answer within {ANSWER_SECONDS} s")


def run_cli(*args: str) -> Outcome:
    """`build.py ARGS` in this process, through main() and its error handling, with captured streams.

    A hang fails the test after ANSWER_SECONDS (an alarm, not a wall-clock deadline per example: a loaded CI
    machine makes answers slower, never a passing case failing)."""
    runner = CliRunner()
    code = 0
    previous = signal.signal(signal.SIGALRM, _no_answer)
    signal.alarm(ANSWER_SECONDS)
    try:
        with runner.isolation() as (out, err, _):
            try:
                main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace"))


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT))


def run_limited(*args: str, cwd: Path = ROOT, timeout: float = 60) -> Outcome:
    """`build.py ARGS` in a subprocess that may use at most MEMORY_LIMIT bytes and CPU_LIMIT CPU seconds."""
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, preexec_fn=_limits, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return Outcome(result.returncode, result.stdout, result.stderr)


def assert_answered(outcome: Outcome, *, allowed_failures: frozenset[str] = frozenset()) -> None:
    """Exit 0; or exit 2 naming file, line (unless about the whole file) and rule; never a traceback.

    `allowed_failures`: rules of an exit-1 Failure that are a legitimate answer for this command (e.g.
    resolve finding no match), as long as they too are named.
    """
    assert "Traceback" not in outcome.err, outcome.err[-3000:]
    if outcome.code == 0:
        return
    errors = list(ERROR_LINE.finditer(outcome.err))
    assert errors, f"exit {outcome.code} without a located, named error:\n{outcome.err[-2000:]}"
    if outcome.code == 1:
        assert {match.group("rule") for match in errors} <= allowed_failures, outcome.err[-2000:]
        return
    assert outcome.code == 2, f"exit {outcome.code}:\n{outcome.err[-2000:]}"
    for match in errors:
        assert match.group("location"), f"no file named in: {match.group(0)}"
        # A command-line value (--set KEY=VALUE) has no lines to name.
        if match.group("rule") not in WHOLE_FILE_RULES and not match.group("location").startswith("--set "):
            assert LOCATED.search(match.group("location")), f"no line in: {match.group(0)}"
