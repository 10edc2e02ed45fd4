"""What a pipeline run did, phase by phase: the progress lines, the estimate of what is left, the final table and
its JSON (reports/pipeline.json). Thread-safe: the build, test and push threads all write here."""
from __future__ import annotations

import enum
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import diskio
from ...model.target import Target

PHASES = ("build", "test", "push")
REPORT_SCHEMA = 1
Say = Callable[[str], None]


class Result(str, enum.Enum):
    PUSHED = "pushed"          # built (or up to date), tested and pushed, verified
    HELD = "held"              # the registry already holds this flavour id: nothing to do (a resumed run)
    BLOCKED = "blocked"        # this machine cannot build it (no base, no wheels): reported with the fix
    FAILED = "failed"          # a phase failed: the run's exit code says so
    INTERRUPTED = "interrupted"
    PENDING = "not started"


@dataclass
class Phase:
    seconds: float = 0.0
    bytes: int = 0             # build: the image's size; push: the bytes uploaded (what the registry lacked)
    ok: bool = False
    message: str = ""
    start: float = 0.0         # seconds from the start of the run (what shows one phase overlapping another)


@dataclass
class Entry:
    flavour: Target
    index: int
    result: Result = Result.PENDING
    reason: str = ""
    fix: str = ""
    digest: str = ""
    phases: dict[str, Phase] = field(default_factory=dict)
    freed_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.flavour.tag, "variant": self.flavour.variant.value, "id": self.flavour.id,
                "result": self.result.value, "reason": self.reason, "fix": self.fix, "digest": self.digest,
                "freed_bytes": self.freed_bytes,
                "phases": {name: {"start": round(phase.start, 1), "seconds": round(phase.seconds, 1), "bytes": phase.bytes, "ok": phase.ok,
                                  "message": phase.message} for name, phase in self.phases.items()}}


class Ledger:
    """Every image of the run, in build order, with the phases each went through."""

    def __init__(self, flavours: list[Target], say: Say, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries = {flavour.tag: Entry(flavour, index) for index, flavour in enumerate(flavours, 1)}
        self.say = say
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()

    def entry(self, flavour: Target) -> Entry:
        return self.entries[flavour.tag]

    def settle(self, flavour: Target, result: Result, reason: str = "", fix: str = "") -> None:
        with self._lock:
            entry = self.entries[flavour.tag]
            entry.result, entry.reason, entry.fix = result, reason, fix
        self._line(flavour, result.value, reason + (f"; fix: {fix}" if fix else ""))

    def started_phase(self, flavour: Target, name: str) -> float:
        """Say the phase started; its start, in seconds from the start of the run."""
        self._line(flavour, name, "started")
        return self.clock() - self.started

    def finished_phase(self, flavour: Target, name: str, phase: Phase) -> None:
        with self._lock:
            self.entries[flavour.tag].phases[name] = phase
        size = f", {phase.bytes / 1e9:.2f} GB" if phase.bytes else ""
        outcome = "ok" if phase.ok else f"FAILED: {_short(phase.message)}"
        self._line(flavour, name, f"{outcome} in {phase.seconds:.0f} s{size}")

    def note(self, text: str) -> None:
        self.say(f"ship: {text}")

    def _line(self, flavour: Target, what: str, text: str) -> None:
        entry = self.entries[flavour.tag]
        elapsed = self.clock() - self.started
        left = self.seconds_left()
        estimate = "" if left is None else f" · left ~{_clock(left)}"
        self.say(f"ship [{entry.index:>2}/{len(self.entries)}] {flavour.tag:<28} {what:<8} {text}"
                 f" · elapsed {_clock(elapsed)}{estimate}")

    def seconds_left(self) -> float | None:
        """From the phases done so far: the remaining builds one after another, the last image's test and push
        after them (a test overlaps the next build), or the tests and pushes still queued, whichever is longer.
        None until one image has been through every phase."""
        with self._lock:
            done = {name: [entry.phases[name].seconds for entry in self.entries.values()
                           if name in entry.phases and entry.phases[name].ok] for name in PHASES}
            if not all(done.values()):
                return None
            mean = {name: sum(values) / len(values) for name, values in done.items()}
            waiting = [entry for entry in self.entries.values() if entry.result is Result.PENDING]
            builds = sum(1 for entry in waiting if "build" not in entry.phases)
            tests = sum(1 for entry in waiting if "test" not in entry.phases)
        if not waiting:
            return 0.0
        by_builds = builds * mean["build"] + mean["test"] + mean["push"]
        by_tests = tests * (mean["test"] + mean["push"])
        return max(by_builds, by_tests)

    def results(self) -> list[Entry]:
        return sorted(self.entries.values(), key=lambda entry: entry.index)

    def to_json(self) -> dict[str, Any]:
        entries = self.results()
        return {"schema": REPORT_SCHEMA, "seconds": round(self.clock() - self.started, 1),
                "counts": {result.value: sum(1 for entry in entries if entry.result is result) for result in Result},
                "bytes_built": sum(entry.phases["build"].bytes for entry in entries if "build" in entry.phases),
                "bytes_pushed": sum(entry.phases["push"].bytes for entry in entries if "push" in entry.phases),
                "flavours": [entry.to_json() for entry in entries]}

    def write(self, path: Path) -> None:
        diskio.write_text_atomic(path, json.dumps(self.to_json(), indent=2) + "\n", "the pipeline report")


def table_rows(entries: list[Entry]) -> list[list[str]]:
    """Per image: tag, result, then seconds/bytes of each phase (what the CLI prints as a table)."""
    rows = []
    for entry in entries:
        cells = [entry.flavour.tag, entry.result.value]
        for name in PHASES:
            phase = entry.phases.get(name)
            cells.append("-" if phase is None else f"{phase.seconds:.0f}" + ("" if phase.ok else " !"))
        build, push = entry.phases.get("build"), entry.phases.get("push")
        cells.append(f"{build.bytes / 1e9:.2f}" if build and build.bytes else "-")
        cells.append(f"{push.bytes / 1e9:.2f}" if push and push.ok else "-")
        pushed = entry.result is Result.PUSHED and push is not None
        cells.append(push.message if pushed and push.message else entry.reason)
        rows.append(cells)
    return rows


TABLE_HEADER = ["flavour", "result", "build s", "test s", "push s", "built GB", "pushed GB", "note"]


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}m{secs:02d}s"


def _short(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
