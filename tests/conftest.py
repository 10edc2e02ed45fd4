"""Markers follow the directory: tests/unit -> unit, tests/engine -> engine, tests/xla -> xla.

Every test has a time limit (TIMEOUTS, by marker; `@pytest.mark.timeout(seconds)` for a test that needs its own;
`--test-timeout SECONDS` for all, 0 for none, e.g. under a debugger). Past it, the test fails with the stack of
every thread; a test that does not give the failure back (stuck in C code, or swallowing it) ends the run with
faulthandler's dump HARD_GRACE seconds later. Either way CI gets a report instead of waiting for its own limit.

Tests that send themselves SIGINT take `ctrl_c_raises`: the suite may be started with SIGINT ignored (a
non-interactive shell's background job, `nohup`), and then no KeyboardInterrupt would come.

No test is random: the hypothesis profile below is loaded for every run, so every property test draws the same
examples on every machine (derandomize), keeps no example database between runs and has a fixed budget unless
it names its own. Random exploration belongs in benchmarks/ (e.g. bench_hostile.py --random).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).parent

# deadline and too_slow judge wall-clock time, which a shared 2-core CI machine does not keep: off, so a loaded
# machine cannot fail a test the idle one passes. Timing targets are benchmarks' business.
settings.register_profile("deterministic", derandomize=True, database=None, max_examples=100, print_blob=True,
                          deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("deterministic")


def _derandomize(item: pytest.Item) -> None:
    """A property test whose own @settings says derandomize=False (or keeps a database) runs derandomized all
    the same: its budget stays, its examples become the same on every run."""
    test = getattr(item, "obj", None)
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if own is not None and (not own.derandomize or own.database is not None):
        test._hypothesis_internal_use_settings = settings(own, derandomize=True, database=None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _derandomize(item)
        kind = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if kind in ("unit", "engine", "xla"):
            item.add_marker(getattr(pytest.mark, kind))


def _require_torch_xla_in_ci() -> None:
    """In CI every suite must really run: a missing engine or torch_xla is a failure, not a skip."""
    import importlib.util

    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and importlib.util.find_spec("torch_xla") is None:
        raise pytest.UsageError("CI=true but torch_xla is not importable: tests/xla would be skipped; "
                                "run ci/setup.sh (it installs torch_xla into .venv)")


# --- per-test time limits ------------------------------------------------------------------------------------

# Seconds per phase (setup, call, teardown) of a test, by its first marker in this order. Generous: the limit is
# there to turn a hang into a failure, not to time anything (docs/ci.md says what the tests take: the real-image
# tests 3-7 min on an idle 2-core machine, ~25% more in a slow hour, about twice that beside other work).
TIMEOUTS = {"slow": 2400, "xla": 900, "engine": 900, "unit": 300}
DEFAULT_TIMEOUT = 300
# After the limit, how long a test has to give the failure back before faulthandler ends the whole run.
HARD_GRACE = 60
# The signal that carries the failure into the main thread. Not SIGALRM: tests use alarm() themselves
# (tests/unit/hostile_inputs.py), and one that cancels an alarm would cancel the limit with it.
TIMEOUT_SIGNAL = signal.SIGUSR2
_real_stderr: list = []  # the terminal's stderr, saved before pytest captures fd 2 (for faulthandler's dump)


class TimeLimitExceeded(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A test past its time limit (a BaseException, like pytest.fail's: a bare `except Exception` cannot eat it)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--test-timeout", type=float, default=None, metavar="SECONDS",
                     help="time limit of every test phase, overriding the per-marker ones (0: no limit)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): this test's own time limit per phase")
    if not _real_stderr:
        _real_stderr.append(os.fdopen(os.dup(2), "w"))
    _require_torch_xla_in_ci()


def time_limit_of(item: pytest.Item) -> float:
    """The time limit of each phase of `item`, in seconds (0: none)."""
    forced = item.config.getoption("--test-timeout")
    if forced is not None:
        return float(forced)
    own = item.get_closest_marker("timeout")
    if own is not None:
        return float(own.args[0])
    return next((float(seconds) for name, seconds in TIMEOUTS.items() if item.get_closest_marker(name)),
                float(DEFAULT_TIMEOUT))


def _other_stacks() -> str:
    """The stack of every thread but the main one (pytest's traceback of the failure shows the main thread's)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main = threading.main_thread().ident
    return "".join(f"\n--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                   for ident, frame in sys._current_frames().items() if ident != main) or " none"


@contextlib.contextmanager
def _time_limit(seconds: float, what: str) -> Iterator[None]:
    """Fail the block (in the main thread) after `seconds`; end the process HARD_GRACE seconds later."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise TimeLimitExceeded(f"{what} took more than {seconds:g} s (its time limit; the main "
                                f"thread's stack is the traceback); the other threads:{_other_stacks()}")

    main = threading.main_thread().ident
    assert main is not None
    previous = signal.signal(TIMEOUT_SIGNAL, expired)
    # A real signal, not _thread.interrupt_main: it wakes a main thread blocked in a wait or a system call.
    timer = threading.Timer(seconds, signal.pthread_kill, args=(main, TIMEOUT_SIGNAL))
    timer.daemon = True
    faulthandler.dump_traceback_later(seconds + HARD_GRACE, exit=True, file=_real_stderr[0] if _real_stderr
                                      else sys.__stderr__)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
        signal.signal(TIMEOUT_SIGNAL, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _time_limit(time_limit_of(item), f"the setup of {item.nodeid}"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _time_limit(time_limit_of(item), item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _time_limit(time_limit_of(item), f"the teardown of {item.nodeid}"):
        return (yield)


# --- Ctrl-C ------------------------------------------------------------------------------------------------------

@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process for the test, whatever disposition the suite inherited
    (a shell's background job and `nohup` start it with SIGINT ignored). Children started meanwhile begin with
    SIGINT at its default (exec resets a handled signal), so a Ctrl-C sent to them is one too."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
