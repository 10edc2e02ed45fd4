"""The one exception family users can cause.

The CLI turns ConfigError into exit code 2 and Failure into exit code 1, printing the message with its
location, the rule broken and a hint; nothing a user can provoke should surface as a traceback.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# The userinfo of a URL (`https://user:secret@host/`): a credential, never printed. Greedy up to the last `@`
# before the host ends, so a raw `@` in a password (`user:p@ss@host`) is covered too.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#]*@")


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters: a message must stay readable whatever the user wrote. URL credentials
    are redacted first: cut in the middle (`https://user:sec...`), they could no longer be recognised."""
    text = redacted(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_value(value: object, limit: int = 60) -> str:
    """A user's value for a message: its repr, shortened."""
    return shorten(repr(value), limit)


def redacted(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***` (`https://***@index/simple/`)."""
    return _USERINFO.sub(r"\1***@", text)


def without_credentials(url: str) -> str:
    """`url` with no userinfo at all: what a file that is committed or shared may name."""
    return _USERINFO.sub(r"\1", url)


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


def _redacted_location(location: Location | str | None) -> Location | str | None:
    if isinstance(location, str):
        return redacted(location)
    if isinstance(location, Location) and redacted(location.path) != location.path:
        return Location(redacted(location.path), location.line, location.column)
    return location


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
        # A URL's credentials are redacted from all of it (message, location, hint): an error is printed, logged
        # and written into reports, and a secret is none of those.
        message = redacted(message)
        super().__init__(message)
        self.message = message
        self.location = _redacted_location(location)
        self.rule = rule
        self.hint = redacted(hint) if hint else hint

    def render(self, explain: bool = True) -> str:
        """One readable block: `file:line: error [rule]: message`, the hint, and last the rule to paste into
        `build.py explain` (xla_images/rules.py holds every rule; scripts read the `error [rule]` prefix).
        `explain=False` where there is no build.py to ask (the standalone ABI tool inside an image)."""
        prefix = f"{self.location}: " if self.location else ""
        rule = f" [{self.rule}]" if self.rule else ""
        text = f"{prefix}error{rule}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        if self.rule and explain:
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
