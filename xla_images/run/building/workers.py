"""Worker threads the main thread can wait for through Ctrl-C, and after it.

Not `Thread.join`: a KeyboardInterrupt raised inside `join()` marks the thread stopped while it still runs
(CPython gh-90882, filed against 3.9-3.11, seen here on 3.11.7: the interrupted wait releases the state lock the
running thread holds), so `is_alive()` answers False from then on. A caller that stops the work and then waits
for `is_alive()` goes on at once, the process exits, and the daemon thread dies half-way through its clean-up (a
build's context temp dir was left so). Here each worker sets an Event of its own as it ends: an interrupted
`Event.wait` leaves the flag right, so waiting again after an interrupt still waits for what runs.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from ...diskio import signals_held


class Workers:
    """`count` daemon threads, each running `target` once (e.g. a loop over a shared queue)."""

    def __init__(self, target: Callable[[], None], count: int, name: str) -> None:
        self._target = target
        self._ended = [threading.Event() for _ in range(count)]
        self._threads = [threading.Thread(target=self._run, args=(ended,), name=f"{name}-{index}", daemon=True)
                         for index, ended in enumerate(self._ended)]

    def start(self) -> None:
        # Ctrl-C is held while they start: one landing between two starts would leave the Events of the threads
        # not started unset, and a wait for them would never end.
        with signals_held():
            for thread in self._threads:
                thread.start()

    def _run(self, ended: threading.Event) -> None:
        try:
            self._target()
        finally:
            ended.set()

    @property
    def running(self) -> int:
        return sum(not ended.is_set() for ended in self._ended)

    def wait(self) -> None:
        """Until every worker has ended. A KeyboardInterrupt comes through and the workers go on: call again
        (or `wait_through_interrupts`) to wait for them."""
        for ended in self._ended:
            ended.wait()

    def wait_through_interrupts(self) -> None:
        """Until every worker has ended, whatever Ctrl-C comes meanwhile: the clean-up after an interrupt must
        run after the workers' own."""
        while True:
            try:
                self.wait()
                return
            except KeyboardInterrupt:
                continue
