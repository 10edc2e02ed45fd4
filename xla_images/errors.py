"""The one exception family users can cause.

The CLI turns ConfigError into exit code 2 and Failure into exit code 1, printing the message with its
location, the rule broken and a hint; nothing a user can provoke should surface as a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters: a message must stay readable whatever the user wrote."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_value(value: object, limit: int = 60) -> str:
    """A user's value for a message: its repr, shortened."""
    return shorten(repr(value), limit)


@dataclass(frozen=True)
class Location:
    """A place in a user's file, 1-based like editors show it."""

    path: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.path
        if self.column is None:
            return f"{self.path}:{self.line}"
        return f"{self.path}:{self.line}:{self.column}"


class XlaImagesError(Exception):
    """Base: a message, and optionally where, which rule and how to fix it."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        location: Location | str | None = None,
        rule: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.location = location
        self.rule = rule
        self.hint = hint

    def render(self) -> str:
        """One readable block: `file:line: error [rule]: message`, the hint, and last the rule to paste into
        `build.py explain` (xla_images/rules.py holds every rule; scripts read the `error [rule]` prefix)."""
        prefix = f"{self.location}: " if self.location else ""
        rule = f" [{self.rule}]" if self.rule else ""
        text = f"{prefix}error{rule}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        if self.rule:
            text += f"\n  explain: build.py explain {self.rule}"
        return text

    def __str__(self) -> str:
        return self.render()


class ConfigError(XlaImagesError):
    """Bad input: matrix, site settings, command-line usage. Exit code 2."""

    exit_code = 2


class Failure(XlaImagesError):
    """A build, check, push or resolve that did not succeed. Exit code 1."""

    exit_code = 1


class ErrorList(ConfigError):
    """Several configuration errors found in one pass, so users fix them all at once."""

    def __init__(self, errors: list[XlaImagesError]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} error(s)")

    def render(self) -> str:
        lines = [error.render() for error in self.errors]
        lines.append(f"{len(self.errors)} errors; nothing was built")
        return "\n".join(lines)
