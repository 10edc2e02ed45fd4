"""Which pythons the index has wheels for, per pinned package version: learned by `update`, checked by validate.

A flavour's pins must each have a wheel for its python on x86_64 Linux, or its lock cannot be made (libtpu 0.0.21
publishes no cp313 wheel: a 3.13 tpu flavour of 2.9.0 cannot exist). The index knows; validation must not ask it
(validate runs on every command, offline, in milliseconds). So `build.py update` records what it read into
WHEELS_FILE next to matrix.yaml, committed with the matrix it describes, and validation checks every flavour
whose wheels come from that index against it:

  wheel-python   torch_xla, torch, (tpu) libtpu or an installed companion has no wheel for the flavour's python
  wheel-cache    the cache file is not what `update` writes

A pin the cache does not know is not checked (the lock still is the final word); `update --write` fills it.
The file names the index it describes; flavours whose wheel source is another index or a wheelhouse are not
checked against it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .. import userfiles
from ..errors import ConfigError, Location, XlaImagesError, shown_value, without_credentials
from .flavour import COMPANIONS, Accelerator, Flavour

WHEELS_FILE = "matrix.wheels.json"
# Where wheels come from when a wheel source names no index_url: pip's default, the public index.
PUBLIC_INDEX = "https://pypi.org/simple/"
SCHEMA = 1
# What a wheel's python and abi tags say about the pythons it installs on.
_CPYTHON = re.compile(r"cp3(\d{1,2})", re.ASCII)
_PYTHON_ENTRY = re.compile(r"3\.\d{1,2}\+?|3\+", re.ASCII)
# The platforms images are built for (model.lockfile.PLATFORMS names manylinux x86_64 ones).
_PLATFORM = re.compile(r"(many)?linux(1|2010|2014|_\d+_\d+)?_x86_64", re.ASCII)
PACKAGES = ("torch-xla", "torch", "libtpu", *COMPANIONS)
# A wheel file name longer than this is no real one (real ones are a fraction of it); not parsed.
MAX_WHEEL_NAME = 512


def wheel_pythons(filenames: Iterable[str], project: str, version: str) -> tuple[str, ...]:
    """The python entries the x86_64 Linux wheels of `project` `version` serve, sorted.

    "3.11" is a cp311-cp311 wheel; "3.9+" a cp39-abi3 one (every later python too); "3+" a py3-none one.
    Free-threaded builds (cp313t) serve another interpreter and count for nothing here.
    """
    wanted = canonicalize_name(project)
    try:
        asked = Version(version)
    except InvalidVersion:
        return ()
    entries: set[str] = set()
    for filename in filenames:
        parsed = parse_wheel(filename)
        if parsed is None or parsed[0] != wanted or parsed[1] != asked:
            continue
        for tag in parsed[2]:
            entry = _entry(tag.interpreter, [tag.abi]) if _PLATFORM.fullmatch(tag.platform) else None
            if entry:
                entries.add(entry)
    return tuple(sorted(entries, key=_entry_key))


def parse_wheel(filename: str) -> tuple[str, Version, frozenset[Tag]] | None:
    """(normalized project, version, tags) of a wheel file name, or None for what is not one. packaging's
    parser, so a build tag (`torchvision-0.24.0-1-cp311-cp311-manylinux_2_28_x86_64.whl`) and compressed tag sets
    (`cp311.cp312`) read like any other name. Names are bounded first: an index page is not trusted."""
    if len(filename) > MAX_WHEEL_NAME or not filename.endswith(".whl"):
        return None
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return name, version, tags


def _entry(python: str, abis: list[str]) -> str | None:
    if python in ("py3", "py2.py3"):
        return "3+"
    match = _CPYTHON.fullmatch(python)
    if match is None:
        return None
    if "abi3" in abis:
        return f"3.{match[1]}+"
    return f"3.{match[1]}" if f"cp3{match[1]}" in abis else None


def _entry_key(entry: str) -> tuple[int, int]:
    minor_text = entry.rstrip("+").partition(".")[2]
    return (int(minor_text) if minor_text else -1, entry.endswith("+"))


def serves(entries: Iterable[str], python: str) -> bool:
    """Whether a package version with these entries has a wheel for `python` (X.Y)."""
    wanted = int(python.partition(".")[2])
    for entry in entries:
        if entry == "3+" or entry == python:
            return True
        if entry.endswith("+") and int(entry[:-1].partition(".")[2]) <= wanted:
            return True
    return False


@dataclass(frozen=True)
class WheelIndex:
    """The cache: index URL, and project -> version -> python entries."""

    index: str
    wheels: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    path: str = WHEELS_FILE

    def pythons(self, project: str, version: str) -> tuple[str, ...] | None:
        """None when the cache does not know this version (then nothing is checked)."""
        return self.wheels.get(canonicalize_name(project), {}).get(version)

    def merged(self, project: str, known: dict[str, tuple[str, ...]]) -> WheelIndex:
        wheels = {name: dict(versions) for name, versions in self.wheels.items()}
        wheels.setdefault(canonicalize_name(project), {}).update(known)
        return WheelIndex(self.index, wheels, self.path)

    def dumps(self) -> str:
        wheels = {name: {version: list(entries) for version, entries in sorted(versions.items(),
                                                                               key=lambda item: Version(item[0]))}
                  for name, versions in sorted(self.wheels.items())}
        # One line per version: the file is reviewed in pull requests.
        # The file is committed: an index URL's credentials never go into it.
        lines = [f'{{"schema": {SCHEMA}, "index": {json.dumps(without_credentials(self.index))}, "wheels": {{']
        for number, (name, versions) in enumerate(wheels.items()):
            lines.append(f" {json.dumps(name)}: {{")
            lines += [f"  {json.dumps(version)}: {json.dumps(entries)}" + ("," if index < len(versions) - 1 else "")
                      for index, (version, entries) in enumerate(versions.items())]
            lines.append(" }" + ("," if number < len(wheels) - 1 else ""))
        return "\n".join(lines) + "\n}}\n"


def load(path: Path) -> WheelIndex | None:
    """The cache at `path`, or None when there is none."""
    if not path.exists():
        return None
    text = userfiles.read_text(path, limit=userfiles.JSON_LIMIT)
    shown = str(path)

    def bad(detail: str) -> ConfigError:
        return ConfigError(f"{detail}", location=Location(shown), rule="wheel-cache",
                           hint=f"regenerate it with `./build.py update --write`, or delete {WHEELS_FILE}")

    try:
        data = json.loads(text, parse_int=userfiles.bounded_int)
    except ValueError as error:
        raise bad(f"not JSON: {error}") from None
    except RecursionError:  # `[[[[...` deeper than the parser recurses
        raise bad("JSON nested too deep to be the wheel cache") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("index"), str) \
            or not isinstance(data.get("wheels"), dict):
        raise bad(f"expected {{schema: {SCHEMA}, index: URL, wheels: {{project: {{version: [python...]}}}}}}")
    wheels: dict[str, dict[str, tuple[str, ...]]] = {}
    for project, versions in data["wheels"].items():
        if not isinstance(versions, dict):
            raise bad(f"wheels.{shown_value(project)} is not a mapping of version -> pythons")
        for version, entries in versions.items():
            if not (isinstance(entries, list) and all(isinstance(e, str) and _PYTHON_ENTRY.fullmatch(e)
                                                      for e in entries)):
                raise bad(f"wheels.{project}.{version} must be a list like [\"3.10\", \"3.11\"] "
                          f"(or \"3+\", \"3.9+\"), not {shown_value(entries)}")
            wheels.setdefault(canonicalize_name(project), {})[version] = tuple(entries)
    return WheelIndex(data["index"], wheels, shown)


def pins(flavour: Flavour) -> list[tuple[str, str]]:
    """(project, version) of each wheel the flavour installs from the index by an exact pin."""
    found = [("torch-xla", flavour.torch_xla), ("torch", flavour.torch)]
    if flavour.accelerator is Accelerator.TPU and flavour.libtpu:
        found.append(("libtpu", flavour.libtpu))
    return found + list(flavour.installed_companions)


def source_url(index_url: str | None) -> str:
    """The index a wheel source without a wheelhouse reads, credentials and all (what requests are sent to)."""
    url = index_url or PUBLIC_INDEX
    return url if url.endswith("/") else url + "/"


def index_of(index_url: str | None) -> str:
    """The index a wheel source without a wheelhouse reads, as the cache names it: without the credentials a
    URL may carry (`https://user:secret@host/simple/`), since WHEELS_FILE is committed."""
    return without_credentials(source_url(index_url))


def check(flavours: Iterable[Flavour], cache: WheelIndex | None) -> list[XlaImagesError]:
    """A `wheel-python` error for each flavour with a pin the cache says has no wheel for its python.

    The caller passes the flavours whose wheels come from the cache's index (plan.load_plan picks them).
    """
    if cache is None:
        return []
    errors: list[XlaImagesError] = []
    for flavour in flavours:
        if flavour.is_nightly:
            continue
        for project, version in pins(flavour):
            entries = cache.pythons(project, version)
            if entries is None or serves(entries, flavour.python):
                continue
            file, _, line = flavour.declared_at.rpartition(":")
            location = Location(file, int(line)) if line.isdigit() else Location(flavour.declared_at)
            shown = ", ".join(entries) or "none for x86_64 Linux"
            errors.append(ConfigError(
                f"{flavour.tag}: {project} {version} has no wheel for python {flavour.python} "
                f"(it has: {shown}; {cache.path})", location=location, rule="wheel-python",
                hint=f"exclude it: - {{torch_xla: \"{flavour.torch_xla}\", python: \"{flavour.python}\""
                     f", accelerator: {flavour.accelerator.value}}}, or pin a {project} that has the wheel"))
            break
    return errors
