"""Workers: waiting for them still waits after a real Ctrl-C landed in the wait (CPython gh-90882 made
`Thread.is_alive()` answer False there, and `build` exited before its workers removed their temp dirs)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from xla_images.run.workers import Workers

pytestmark = pytest.mark.unit


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt in the main thread


def test_a_ctrl_c_in_the_wait_comes_through_and_a_second_wait_still_waits() -> None:
    release = threading.Event()
    cleaned: list[str] = []

    def work() -> None:
        time.sleep(0.2)  # the main thread is in wait() by now (or in start(): the interrupt then comes after it)
        _interrupt_self()
        release.wait()
        time.sleep(0.3)  # a clean-up that takes a while, like removing a build context
        cleaned.append("done")

    workers = Workers(work, 1, name="test")
    with pytest.raises(KeyboardInterrupt):
        workers.start()
        workers.wait()
    assert workers.running == 1  # interrupted, not ended: the worker waits for `release`
    release.set()
    workers.wait()
    assert cleaned == ["done"] and workers.running == 0


def test_wait_through_interrupts_waits_for_every_worker_whatever_ctrl_c_comes() -> None:
    cleaned: list[int] = []

    def work(index: int) -> None:
        time.sleep(0.5)  # the main thread is in wait_through_interrupts() by now
        if index == 0:
            for _ in range(3):
                _interrupt_self()
                time.sleep(0.1)
        time.sleep(0.3)
        cleaned.append(index)

    counter = iter(range(3))
    lock = threading.Lock()

    def next_work() -> None:
        with lock:
            index = next(counter)
        work(index)

    workers = Workers(next_work, 3, name="test")
    workers.start()
    workers.wait_through_interrupts()
    assert sorted(cleaned) == [0, 1, 2] and workers.running == 0


def test_a_worker_that_raises_has_ended() -> None:
    def work() -> None:
        raise RuntimeError("a bug in a worker")

    previous = threading.excepthook
    threading.excepthook = lambda args: None  # the test's own error, expected: not printed
    try:
        workers = Workers(work, 2, name="test")
        workers.start()
        workers.wait()
    finally:
        threading.excepthook = previous
    assert workers.running == 0
