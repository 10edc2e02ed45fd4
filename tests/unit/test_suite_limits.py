"""The suite itself (tests/conftest.py): a test that hangs fails within its time limit with the threads' stacks,
and the tests of Ctrl-C pass however the suite was started, SIGINT ignored included (a non-interactive shell's
background job, `nohup`). Each case runs pytest in a child process, bounded by a timeout of its own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HANGING = '''
import threading

def test_waits_forever():
    threading.Thread(target=threading.Event().wait, name="side-waiter", daemon=True).start()
    threading.Event().wait()

def test_after_it():
    pass
'''


def _pytest(args: list[str], *, sigint_ignored: bool = False, timeout: float = 240) -> subprocess.CompletedProcess:
    # This checkout first, then whatever the suite itself was given (the same plugins the parent can load).
    path = [str(ROOT), str(ROOT / "smoke"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=ignore_sigint if sigint_ignored else None)


# In this process, and in a pytest-xdist worker as ci/test.sh runs the unit and xla suites (the test runs in the
# worker's main thread, where the limit's signal lands).
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "1"]], ids=["serial", "xdist-worker"])
def test_a_hanging_test_fails_at_its_limit_with_the_stacks_and_the_run_goes_on(workers: list[str]) -> None:
    test = ROOT / "tests" / "unit" / f"test_hangs_{os.getpid()}.py"  # under tests/: the suite's conftest applies
    test.write_text(HANGING, encoding="utf-8")
    try:
        started = time.monotonic()
        result = _pytest([*workers, str(test), "--test-timeout", "3"], timeout=60)
        took = time.monotonic() - started
    finally:
        test.unlink()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "test_waits_forever took more than 3 s (its time limit" in result.stdout
    assert "--- thread side-waiter:" in result.stdout  # the other threads' stacks
    assert f"{test.name}:6: " in result.stdout  # the main thread's: where it waited
    assert took < 40


@pytest.mark.parametrize("files", [["tests/unit/test_workers.py"],
                                   ["tests/unit/test_interrupts.py", "-k", "orphan or start_up and click"],
                                   ["tests/unit/test_faults_units.py", "-k", "crash_of_pytest"]],
                         ids=["workers", "interrupts", "checks-crash"])
def test_the_ctrl_c_tests_pass_when_the_suite_starts_with_sigint_ignored(files: list[str]) -> None:
    # The limit is short: before the fix, the workers' test waited forever.
    result = _pytest([*files, "--test-timeout", "60"], sigint_ignored=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
