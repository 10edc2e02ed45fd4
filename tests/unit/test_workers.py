"""Workers: waiting for them still waits after a real Ctrl-C landed in the wait (CPython gh-90882 made
`Thread.is_alive()` answer False there, and `build` exited before its workers removed their temp dirs)."""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable

import pytest

from xla_images.run.building.workers import Workers

# SIGINT raises KeyboardInterrupt however the suite was started (tests/conftest.py).
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("ctrl_c_raises")]


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt in the main thread


def _until_the_main_thread_is_in(method: Callable, timeout: float = 60) -> None:
    """Until `method` is on the main thread's stack: an interrupt sent then lands in it, however slow the
    machine (sleeping "long enough" would not say so)."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code is method.__code__:
                return
            frame = frame.f_back
        time.sleep(0.01)


def test_a_ctrl_c_in_the_wait_comes_through_and_a_second_wait_still_waits() -> None:
    release = threading.Event()
    cleaned: list[str] = []

    def work() -> None:
        _until_the_main_thread_is_in(Workers.wait)
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

    indexes: queue.Queue[int] = queue.Queue()
    for index in range(3):
        indexes.put(index)

    def work() -> None:
        index = indexes.get_nowait()
        _until_the_main_thread_is_in(Workers.wait_through_interrupts)
        if index == 0:
            for _ in range(3):
                _interrupt_self()
                time.sleep(0.1)
        time.sleep(0.3)
        cleaned.append(index)

    workers = Workers(work, 3, name="test")
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
