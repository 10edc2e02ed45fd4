"""The engine tests' build Reporters: one that keeps what it is told (the `reporter` fixture), one that shows
only notices (for module-scoped fixtures, which cannot use `reporter`). The CLI's displays are exercised by the
CLI tests."""
from __future__ import annotations

import sys

from xla_images.model.flavour import Flavour
from xla_images.run.building import build


class RecordingReporter:
    """A Reporter that keeps what it is told (the CLI's displays are exercised by the CLI tests)."""

    def __init__(self) -> None:
        self.notices: list[str] = []
        self.states: list[tuple[str, str]] = []
        self.results: list[build.FlavourResult] = []

    def state(self, flavour: Flavour, text: str) -> None:
        self.states.append((flavour.tag, text))

    def finished(self, result: build.FlavourResult) -> None:
        self.results.append(result)

    def notice(self, text: str) -> None:
        self.notices.append(text)


class QuietReporter:
    """Shows nothing of a build but its notices, on stderr (pytest shows them for a failed test)."""

    def state(self, flavour: Flavour, text: str) -> None:
        pass

    def finished(self, result: build.FlavourResult) -> None:
        pass

    def notice(self, text: str) -> None:
        print(f"build: {text}", file=sys.stderr)
