"""What the image promises about itself, and how a promise is compared with what is installed.

Expectations come from the `XLA_IMAGES_*` environment the image bakes in; a command-line flag overrides its
variable. Standard library only: this module runs before torch is imported.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

ENV_PREFIX = "XLA_IMAGES_"
ABI_VALUES = ("cxx11", "pre-cxx11")
ACCELERATOR_VALUES = ("tpu", "cpu")


class UsageError(Exception):
    """Bad input from the caller (flag or environment); the CLI exits 2 with this message."""


@dataclasses.dataclass(frozen=True)
class Expectations:
    """One field per `XLA_IMAGES_*` variable. None means nobody told us: that is reported, never passed.

    `libtpu` is special: the empty string is a real expectation ("this image has no libtpu").
    """

    tag: Optional[str] = None
    abi: Optional[str] = None
    python: Optional[str] = None
    torch: Optional[str] = None
    torch_xla: Optional[str] = None
    libtpu: Optional[str] = None
    accelerator: Optional[str] = None

    @property
    def expects_cxx11_abi(self) -> Optional[bool]:
        return None if self.abi is None else self.abi == "cxx11"

    def missing(self) -> list[str]:
        return [field.name for field in dataclasses.fields(self) if getattr(self, field.name) is None]

    def as_dict(self) -> dict[str, Optional[str]]:
        return dataclasses.asdict(self)


def env_var(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--expect-" + field_name.replace("_", "-")


def load(environ: Mapping[str, str], overrides: Mapping[str, Optional[str]]) -> Expectations:
    """Merge the environment with flags (a flag given as None was not passed) and validate the result."""
    values: dict[str, Optional[str]] = {}
    for field in dataclasses.fields(Expectations):
        value = overrides.get(field.name)
        if value is None:
            value = environ.get(env_var(field.name))
        values[field.name] = _normalise(field.name, value)
    expectations = Expectations(**values)
    _validate(expectations)
    return expectations


def _normalise(field_name: str, value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    value = value.strip()
    # An empty libtpu says "no libtpu expected"; for every other field an empty value says nothing.
    if value == "" and field_name != "libtpu":
        return None
    return value.lower() if field_name in ("abi", "accelerator") else value


def _validate(expectations: Expectations) -> None:
    if expectations.abi is not None and expectations.abi not in ABI_VALUES:
        raise UsageError(
            f"expected ABI {expectations.abi!r} is not one of {', '.join(ABI_VALUES)} "
            f"(from {flag_name('abi')} or {env_var('abi')})")
    if expectations.accelerator is not None and expectations.accelerator not in ACCELERATOR_VALUES:
        raise UsageError(
            f"expected accelerator {expectations.accelerator!r} is not one of {', '.join(ACCELERATOR_VALUES)} "
            f"(from {flag_name('accelerator')} or {env_var('accelerator')})")


def public_version(version: str) -> str:
    """`2.6.0+cxx11` -> `2.6.0`: the local label names a build flavour, not a release."""
    return version.split("+", 1)[0].strip()


def version_matches(expected: str, actual: str) -> bool:
    """True when `expected`'s release components are the leading components of `actual`'s.

    So `3.11` matches python `3.11.7`, and `2.9.0` matches torch `2.9.0+cu128`, but `2.9.0` does not match
    `2.9.1` and `2.9.0` does not match `2.9`.
    """
    expected_parts = public_version(expected).split(".")
    actual_parts = public_version(actual).split(".")
    if len(expected_parts) > len(actual_parts):
        return False
    return actual_parts[: len(expected_parts)] == expected_parts


def abi_word(cxx11: bool) -> str:
    return "cxx11" if cxx11 else "pre-cxx11"
