"""run.pipeline.runner with phases of our own (the engine's are proven in tests/engine/test_pipeline.py): the next
build overlaps the current test, at most `window` images exist at once, a failure fails only its image, the
build cache is freed between cache groups, held images are skipped, and a bug in a thread is not lost."""
from __future__ import annotations

import threading

import pytest

from golden import fixed_flavour_list
from xla_images.errors import Failure
from xla_images.model.target import Target
from xla_images.run.building.groups import build_order, cache_group
from xla_images.run.pipeline import runner
from xla_images.run.pipeline.ledger import Ledger, Phase, Result

WAIT = 10.0  # seconds any fake phase may wait for another before the test fails (never a hang)


def images(count: int) -> list[Target]:
    return build_order(fixed_flavour_list())[:count]


class FakePhases:
    """Phases that record what happened when, and can be told to fail or to wait for one another."""

    def __init__(self, *, fail: dict[str, str] | None = None, held: set[str] = frozenset(),
                 first_test_waits_for: int = 0) -> None:
        self.fail = fail or {}
        self.held_tags = held
        self.events: list[tuple[str, str]] = []
        self.alive: set[str] = set()
        self.most_alive = 0
        self.lock = threading.Lock()
        self.first_test_waits_for = first_test_waits_for
        self.filled = threading.Event()

    def _event(self, what: str, tag: str) -> None:
        with self.lock:
            self.events.append((what, tag))

    def held(self, flavour: Target) -> str | None:
        return "sha256:" + "a" * 64 if flavour.tag in self.held_tags else None

    def build(self, flavour: Target) -> Phase:
        self._event("build", flavour.tag)
        with self.lock:
            self.alive.add(flavour.tag)
            self.most_alive = max(self.most_alive, len(self.alive))
            if len(self.alive) >= self.first_test_waits_for:
                self.filled.set()
        if self.fail.get(flavour.tag) == "build":
            raise Failure("pip could not download", rule="wheel-download")
        return Phase(ok=True, bytes=1000)

    def test(self, flavour: Target) -> Phase:
        self._event("test", flavour.tag)
        if self.first_test_waits_for and not self.filled.wait(WAIT):
            raise AssertionError(f"the builds never filled {self.first_test_waits_for} slots")
        self._event("tested", flavour.tag)
        return Phase(ok=self.fail.get(flavour.tag) != "test", message="smoke failed")

    def push(self, flavour: Target) -> tuple[Phase, str]:
        self._event("push", flavour.tag)
        return Phase(ok=True, bytes=10), "sha256:" + "b" * 64

    def free_image(self, flavour: Target) -> int:
        self._event("free", flavour.tag)
        with self.lock:
            self.alive.discard(flavour.tag)
        return 1000

    def free_cache(self) -> int:
        self._event("cache", "")
        return 5


def run(flavours: list[Target], phases: FakePhases, **options) -> Ledger:
    ledger = Ledger(flavours, say=lambda line: None)
    worker = threading.Thread(target=runner.run, args=(flavours, phases, ledger, runner.RunnerOptions(**options)))
    worker.start()
    worker.join(WAIT * 3)
    assert not worker.is_alive(), "the pipeline did not finish"
    return ledger


def test_every_image_goes_through_build_test_push_and_is_freed() -> None:
    flavours = images(4)
    phases = FakePhases()
    ledger = run(flavours, phases)
    assert [entry.result for entry in ledger.results()] == [Result.PUSHED] * 4
    for flavour in flavours:
        mine = [what for what, tag in phases.events if tag == flavour.tag]
        assert mine == ["build", "test", "tested", "push", "free"], (flavour.tag, mine)
    assert phases.alive == set()


def test_the_next_build_starts_while_the_current_image_is_tested() -> None:
    phases = FakePhases(first_test_waits_for=2)  # the first test goes on only once the second image is built
    run(images(2), phases)
    first, second = images(2)
    events = phases.events
    assert events.index(("build", second.tag)) < events.index(("tested", first.tag))


@pytest.mark.parametrize("window", [1, 2, 3])
def test_no_more_images_exist_at_once_than_the_window(window: int) -> None:
    # The first test waits until `window` images exist: the builds must get that far, and no further.
    phases = FakePhases(first_test_waits_for=window)
    ledger = run(images(6), phases, window=window)
    assert phases.most_alive == window
    assert [entry.result for entry in ledger.results()] == [Result.PUSHED] * 6


def test_a_failed_image_fails_alone_and_stays_for_a_look() -> None:
    flavours = images(3)
    phases = FakePhases(fail={flavours[0].tag: "build", flavours[1].tag: "test"})
    ledger = run(flavours, phases)
    results = [entry.result for entry in ledger.results()]
    assert results == [Result.FAILED, Result.FAILED, Result.PUSHED]
    assert ledger.entry(flavours[0]).reason.startswith("build: pip could not download")
    assert ledger.entry(flavours[1]).reason.startswith("test: smoke failed")
    assert ("free", flavours[1].tag) not in phases.events  # kept (keep_failed), but its slot is free again
    assert ("push", flavours[1].tag) not in phases.events


def test_held_images_are_skipped_and_no_phase_runs() -> None:
    flavours = images(3)
    phases = FakePhases(held={flavours[1].tag})
    ledger = run(flavours, phases)
    assert ledger.entry(flavours[1]).result is Result.HELD
    assert [tag for _, tag in phases.events if tag == flavours[1].tag] == []


def test_the_build_cache_is_freed_between_cache_groups_only() -> None:
    flavours = build_order(fixed_flavour_list())
    phases = FakePhases()
    run(flavours, phases)
    builds = [tag for what, tag in phases.events if what in ("build", "cache")]
    groups = [cache_group(flavour) for flavour in flavours]
    expected = sum(1 for before, after in zip(groups, groups[1:] + [None]) if before != after)
    assert sum(1 for what, _ in phases.events if what == "cache") == expected
    assert len(builds) == len(flavours) + expected


def test_a_bug_in_a_thread_stops_the_run_and_is_raised() -> None:
    class Broken(FakePhases):
        def test(self, flavour: Target) -> Phase:
            raise RuntimeError("a bug")

    flavours = images(3)
    ledger = Ledger(flavours, say=lambda line: None)
    with pytest.raises(RuntimeError, match="a bug"):
        runner.run(flavours, Broken(), ledger)
    assert Result.PUSHED not in {entry.result for entry in ledger.results()}


def runtime_and_devel() -> list[Target]:
    runtime = images(1)[0]
    return build_order([runtime, runtime.devel])


def test_a_runtime_image_stays_until_its_devel_image_was_tested_against_it() -> None:
    runtime, devel = runtime_and_devel()
    phases = FakePhases()
    ledger = run([runtime, devel], phases)
    assert [entry.result for entry in ledger.results()] == [Result.PUSHED, Result.PUSHED]
    events = phases.events
    assert events.index(("free", runtime.tag)) > events.index(("tested", devel.tag))
    assert phases.alive == set()


def test_a_held_runtime_image_is_built_again_when_its_devel_image_is_not_held() -> None:
    runtime, devel = runtime_and_devel()
    phases = FakePhases(held={runtime.tag})
    ledger = run([runtime, devel], phases)
    assert ("build", runtime.tag) in phases.events
    assert [entry.result for entry in ledger.results()] == [Result.PUSHED, Result.PUSHED]
    both = FakePhases(held={runtime.tag, devel.tag})
    assert [entry.result for entry in run([runtime, devel], both).results()] == [Result.HELD, Result.HELD]
    assert both.events == []


def test_a_devel_image_that_fails_to_build_lets_its_runtime_image_go() -> None:
    runtime, devel = runtime_and_devel()
    phases = FakePhases(fail={devel.tag: "build"})
    ledger = run([runtime, devel], phases)
    assert [entry.result for entry in ledger.results()] == [Result.PUSHED, Result.FAILED]
    assert ("free", runtime.tag) in phases.events


class InterruptedPhases(FakePhases):
    """Ctrl-C arrives during the second build, once the first image's test has started; that test ends only
    after the run said it was interrupted (by then it has stopped: no race with the pusher)."""

    def __init__(self) -> None:
        super().__init__()
        self.testing = threading.Event()
        self.said_interrupted = threading.Event()

    def build(self, flavour: Target) -> Phase:
        if any(what == "build" for what, _ in self.events):
            assert self.testing.wait(WAIT), "the first image's test never started"
            raise KeyboardInterrupt
        return super().build(flavour)

    def test(self, flavour: Target) -> Phase:
        self.testing.set()
        assert self.said_interrupted.wait(WAIT), "the run never said it was interrupted"
        return super().test(flavour)


def test_ctrl_c_lets_the_test_in_flight_finish_starts_nothing_new_and_says_so() -> None:
    flavours = images(3)
    phases = InterruptedPhases()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if "interrupted" in line:
            phases.said_interrupted.set()

    ledger = Ledger(flavours, say=say)
    raised: list[BaseException] = []

    def ship() -> None:
        try:
            runner.run(flavours, phases, ledger)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            raised.append(error)

    worker = threading.Thread(target=ship)
    worker.start()
    worker.join(WAIT * 3)
    assert not worker.is_alive(), "the pipeline did not finish"
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)
    assert ("tested", flavours[0].tag) in phases.events  # the test in flight finished
    assert not any(what == "push" for what, _ in phases.events)  # nothing new started
    assert [entry.result for entry in ledger.results()] == [Result.INTERRUPTED] * 3
    assert any("interrupted" in line and "resume" in line for line in lines)
