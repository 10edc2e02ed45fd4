"""The pipeline itself: build → test → push, three phases on three threads, for any number of images.

The main thread builds, image after image (one build at a time: on two cores a second one only halves the
speed of both); a tester thread runs each built image's checks and smoke suite while the next one builds; a
pusher thread pushes each image that passed, then frees it. At most `window` images are built and not yet freed
at any moment (the build waits for a slot), so the disk holds a bounded number of images whatever the size of
the matrix; between cache groups (run.building.groups) the build cache is freed too.

Builds run on the main thread because that is where Ctrl-C (and SIGTERM, which the CLI turns into one) arrives:
a build in flight is aborted by its own clean-up, tests and pushes in flight finish, nothing new starts.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from ...errors import XlaImagesError
from ...model.target import Target
from ..building.groups import cache_group
from .ledger import Ledger, Phase, Result

JOIN_POLL_SECONDS = 0.5


class Phases(Protocol):
    """What the pipeline does to one image; each phase returns how it went (the runner times it)."""

    def held(self, flavour: Target) -> str | None:
        """The digest the registry already holds for this flavour id (nothing to do), else None."""

    def build(self, flavour: Target) -> Phase: ...

    def test(self, flavour: Target) -> Phase: ...

    def push(self, flavour: Target) -> tuple[Phase, str]:
        """The push and the verified digest."""

    def free_image(self, flavour: Target) -> int:
        """Remove the image from the engine; the bytes freed."""

    def free_cache(self) -> int:
        """Drop the engine's unused build cache; the bytes freed."""


@dataclass(frozen=True)
class RunnerOptions:
    window: int = 2              # images built and not yet freed: 2 lets one build overlap one test (+ push)
    free_images: bool = True     # remove each image once pushed (it is in the registry, by digest)
    free_cache: bool = True      # drop the build cache between cache groups
    keep_failed: bool = True     # a failed image stays on the engine for a look (it still frees its slot)


def run(flavours: list[Target], phases: Phases, ledger: Ledger, options: RunnerOptions = RunnerOptions()) -> None:
    """Take every flavour (in the given order) as far as it goes; the ledger records how far that was."""
    _Pipeline(phases, ledger, options).run(flavours)


class _Pipeline:
    def __init__(self, phases: Phases, ledger: Ledger, options: RunnerOptions) -> None:
        self.phases, self.ledger, self.options = phases, ledger, options
        self.to_test: queue.Queue[Target | None] = queue.Queue()
        self.to_push: queue.Queue[Target | None] = queue.Queue()
        self.slots = threading.BoundedSemaphore(max(1, options.window))
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        # A devel image is tested with its runtime image beside it (its checks compare the two): a runtime image
        # whose devel image is in the run is freed only once that devel image is done with it.
        self.devel_pending: set[str] = set()   # runtime tags whose devel image is not done yet
        self.deferred: dict[str, Target] = {}  # runtime images pushed, waiting for their devel image
        self.free_lock = threading.Lock()

    def run(self, flavours: list[Target]) -> None:
        threads = [threading.Thread(target=self._guarded, args=(self._test_loop,), name="pipeline-test", daemon=True),
                   threading.Thread(target=self._guarded, args=(self._push_loop,), name="pipeline-push", daemon=True)]
        for thread in threads:
            thread.start()
        try:
            self._build_all(self._not_held(flavours))
        except BaseException as error:
            self.stop.set()
            if isinstance(error, KeyboardInterrupt):
                self.ledger.note("interrupted: the build in flight is stopped; a test in flight finishes (a few "
                                 "minutes at most), nothing new starts. Run the same command again to resume.")
            raise
        finally:
            self.to_test.put(None)  # the tester passes the end on to the pusher
            _join(threads)
            for flavour in list(self.deferred.values()):
                self._free(flavour)
            for entry in self.ledger.results():
                if entry.result is Result.PENDING and self.stop.is_set():
                    entry.result = Result.INTERRUPTED
        if self.errors:
            raise self.errors[0]

    def _not_held(self, flavours: list[Target]) -> list[Target]:
        """Ask the registry about every image first (a resumed run shows at once what is left). A runtime image
        is built again, though held, when its devel image is not: the devel image's checks need it here."""
        held = {}
        for flavour in flavours:
            try:
                digest = self.phases.held(flavour)
            except XlaImagesError as error:
                self.ledger.settle(flavour, Result.FAILED, f"asking the registry: {error.message}")
                continue
            if digest is not None:
                held[flavour.tag] = digest
        tags = {flavour.tag for flavour in flavours}
        for flavour in flavours:
            if not flavour.is_devel and flavour.devel.tag in tags and flavour.devel.tag not in held:
                held.pop(flavour.tag, None)
        for flavour in flavours:
            if flavour.tag in held:
                self.ledger.entry(flavour).digest = held[flavour.tag]
                self.ledger.settle(flavour, Result.HELD,
                                   f"the registry holds flavour id {flavour.id[7:19]} as {held[flavour.tag][:19]}")
        todo = [flavour for flavour in flavours
                if flavour.tag not in held and self.ledger.entry(flavour).result is Result.PENDING]
        todo_tags = {flavour.tag for flavour in todo}
        self.devel_pending = {flavour.runtime_tag for flavour in todo if flavour.is_devel
                              and flavour.runtime_tag in todo_tags}
        return todo

    def _build_all(self, flavours: list[Target]) -> None:
        for position, flavour in enumerate(flavours):
            if self.stop.is_set():
                return
            if not self._acquire_slot():
                return
            phase = self._timed(flavour, "build", lambda: self.phases.build(flavour))
            if phase.ok:
                self.to_test.put(flavour)
            else:
                self._failed(flavour, "build", phase)
            following = flavours[position + 1] if position + 1 < len(flavours) else None
            if self.options.free_cache and (following is None or cache_group(following) != cache_group(flavour)):
                self._free_cache(flavour)

    def _acquire_slot(self) -> bool:
        """Wait for an image to be freed (polling, so Ctrl-C is not held up by the wait); False once stopped."""
        while not self.slots.acquire(timeout=JOIN_POLL_SECONDS):
            if self.stop.is_set():
                return False
        return True

    def _test_loop(self) -> None:
        while (flavour := self.to_test.get()) is not None:
            if self.stop.is_set():
                self._release(flavour, free=False)
                continue
            phase = self._timed(flavour, "test", lambda: self.phases.test(flavour))
            self._devel_done(flavour)
            if phase.ok:
                self.to_push.put(flavour)
            else:
                self._failed(flavour, "test", phase)
        self.to_push.put(None)

    def _push_loop(self) -> None:
        while (flavour := self.to_push.get()) is not None:
            if self.stop.is_set():
                self._release(flavour, free=False)
                continue
            result: list[str] = []
            phase = self._timed(flavour, "push", lambda: _with_digest(self.phases.push(flavour), result))
            if not phase.ok:
                self._failed(flavour, "push", phase)
                continue
            self.ledger.entry(flavour).digest = result[0]
            self._release(flavour, free=self.options.free_images)
            self.ledger.settle(flavour, Result.PUSHED, f"as {result[0]}")

    def _failed(self, flavour: Target, name: str, phase: Phase) -> None:
        if name == "build":
            self._devel_done(flavour)
        self._release(flavour, free=self.options.free_images and not self.options.keep_failed)
        self.ledger.settle(flavour, Result.FAILED, f"{name}: {phase.message}")

    def _release(self, flavour: Target, *, free: bool) -> None:
        """Give the image's slot back; free it now, or once its devel image is done with it."""
        try:
            if free:
                with self.free_lock:
                    waits = not flavour.is_devel and flavour.tag in self.devel_pending
                    if waits:
                        self.deferred[flavour.tag] = flavour
                if not waits:
                    self._free(flavour)
        finally:
            self.slots.release()

    def _devel_done(self, flavour: Target) -> None:
        """A devel image was tested (or failed to build): its runtime image may go, if it waited for that."""
        if not flavour.is_devel:
            return
        with self.free_lock:
            self.devel_pending.discard(flavour.runtime_tag)
            waiting = self.deferred.pop(flavour.runtime_tag, None)
        if waiting is not None:
            self._free(waiting)

    def _free(self, flavour: Target) -> None:
        with self.free_lock:
            self.deferred.pop(flavour.tag, None)
        try:
            self.ledger.entry(flavour).freed_bytes = self.phases.free_image(flavour)
        except XlaImagesError as error:
            self.ledger.note(f"{flavour.tag}: could not free the image: {error.message}")

    def _free_cache(self, flavour: Target) -> None:
        try:
            freed = self.phases.free_cache()
            self.ledger.note(f"after {flavour.tag}: build cache freed, {freed / 1e9:.2f} GB")
        except XlaImagesError as error:
            self.ledger.note(f"after {flavour.tag}: could not free the build cache: {error.message}")

    def _timed(self, flavour: Target, name: str, work: Callable[[], Phase]) -> Phase:
        start = self.ledger.started_phase(flavour, name)
        started = time.monotonic()
        try:
            phase = work()
        except XlaImagesError as error:
            phase = Phase(ok=False, message=error.message)
        phase.seconds, phase.start = time.monotonic() - started, start
        self.ledger.finished_phase(flavour, name, phase)
        return phase

    def _guarded(self, loop: Callable[[], None]) -> None:
        """A bug in a worker thread stops the run and is raised in the main thread, not lost."""
        try:
            loop()
        except BaseException as error:  # noqa: BLE001 - re-raised by run()
            self.errors.append(error)
            self.stop.set()
            if loop == self._test_loop:
                self.to_push.put(None)


def _with_digest(answer: tuple[Phase, str], into: list[str]) -> Phase:
    phase, digest = answer
    into.append(digest)
    return phase


def _join(threads: list[threading.Thread]) -> None:
    """Wait for the threads, through any number of Ctrl-C: each finishes the image it is on."""
    for thread in threads:
        while thread.is_alive():
            try:
                thread.join(JOIN_POLL_SECONDS)
            except KeyboardInterrupt:
                continue
