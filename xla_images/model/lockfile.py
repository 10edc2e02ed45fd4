"""The lock file, Dockerfiles/<tag>/requirements.lock: its format, and the inputs that make it fresh or stale.

A lock pins a target's FULL wheel closure, one `name==version --hash=sha256:...  # FILE.whl` line per wheel,
sorted, so an image build installs with `--require-hashes` and gets exactly the files that were resolved. Its
header records `# inputs: sha256:<hash>` of what it was resolved from (`lock_inputs`: requirements, the group
union, python, platforms and the wheel source), so a stale lock is found without the network. Locks are
made and checked by run.packages.lock (the one run module for them); a nightly's lock is also the one record of
which night it installs (model.nightly).

Which inputs a lock may be resolved from, and so when it is fresh (`attempts`, `lock_status`):

A release family (one torch_xla, ABI and wheel source) is locked python by python, the lowest (the anchor) first.
A flavour is resolved together with the flavours that differ from it only by accelerator (its group), and, off the
anchor python, with the anchor's python-independent pins too (`aligned_pins`), so its `torch-any` layer holds the
same wheels byte for byte (see layers.py). Each way of resolving is an `Attempt`, tried in order:

  with pins:    the group + the pins; the group alone (recorded as `unaligned`); the flavour alone (`unaligned`)
  without pins: the group; the flavour alone

and a lock is fresh when its recorded inputs are those of one of its attempts.
"""
from __future__ import annotations

import enum
import hashlib
import os
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import userfiles
from ..errors import ConfigError, XlaImagesError, Failure, Location, shorten, shown_value
from ..names import GENERATED_MARK, LOCK_NAME
from .site import Site, WheelSource
from .flavour import Flavour, nightly_specifier
from .target import Target

LOCK_SCHEMA = 1
# Wheels an image can load: the rendered Dockerfiles default to bookworm bases (glibc 2.36), so manylinux up to
# 2_36 and every older tag; libtpu ships manylinux_2_31 wheels. `linux_x86_64` is what a from-source build
# (wheel-builds/build-wheels.sh) produces. Order matters to pip: the first tag is preferred.
GLIBC_NEWEST_MINOR = 36
PLATFORMS: tuple[str, ...] = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_NEWEST_MINOR, 16, -1)),
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64",
)
_LOCK_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+) --hash=sha256:(?P<sha256>[0-9a-f]{64})"
    r"(?:\s+#\s+(?P<filename>[^/\\\s]+\.whl)(?P<local> \(wheelhouse\))?)?\s*$")
MAX_LOCK_LINE = 1024
_INPUTS_LINE = re.compile(r"^# inputs: (?P<inputs>sha256:[0-9a-f]{64})\s*$")


@dataclass(frozen=True)
class LockEntry:
    """One locked wheel. `local` wheels come from a wheelhouse on the host, not from an index."""

    name: str
    version: str
    sha256: str
    filename: str
    local: bool = False

    def line(self) -> str:
        origin = " (wheelhouse)" if self.local else ""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}  # {self.filename}{origin}"


@dataclass(frozen=True)
class Lock:
    inputs: str
    entries: tuple[LockEntry, ...]

    def by_name(self) -> dict[str, LockEntry]:
        return {entry.name: entry for entry in self.entries}


def format_lock(flavour: Target, inputs: str, entries: Iterable[LockEntry]) -> str:
    source = flavour.wheel_source
    lines = [
        f"# {GENERATED_MARK} (`./build.py lock`) from matrix.yaml and the wheel source. Do not edit this",
        f"# file: regenerate it with `./build.py lock {flavour.tag}`.",
        f"# flavour: {flavour.tag} (python {flavour.python}, {flavour.abi.value}, wheel source {source.name})",
        f"# requirements: {' '.join(flavour.requirements)}",
        f"# inputs: {inputs}",
        "# The image installs it with: pip install --require-hashes --only-binary=:all: -r requirements.lock",
    ]
    lines.extend(entry.line() for entry in sorted(entries, key=lambda entry: entry.name))
    return "\n".join(lines) + "\n"


def format_constraints(flavour: Flavour, lock_text: str) -> str:
    """Dockerfiles/<tag>/constraints.txt: the lock's pins as a pip (and uv) constraints file, the one an image's
    PIP_CONSTRAINT names, so that `pip install X` in a derived image picks the X that fits torch, torch_xla and
    libtpu or fails naming the pinned package.

    The whole lock, without hashes (a hash in a constraints file puts pip in hash-checking mode for every package
    the user installs). The lock is exactly the closure of torch, torch_xla and libtpu (its requirements are
    those pins), and docs/derived.md has the measurements that chose it over pinning the three alone. Without a
    readable lock (before `lock`, or a hand-broken one, which `render --check` and the build report) the file
    holds the requirement pins, so the render stays pure and the image still cannot lose its torch.
    """
    try:
        entries: Iterable[LockEntry] = parse_lock(lock_text).entries if lock_text else ()
    except ConfigError:
        entries = ()
    pins = [f"{entry.name}=={entry.version}" for entry in sorted(entries, key=lambda entry: entry.name)]
    origin = f"the pins of {LOCK_NAME}" if pins else f"the flavour's pins ({LOCK_NAME} is not there yet)"
    lines = [
        f"# {GENERATED_MARK} (`./build.py render`) from {origin}: do not edit.",
        f"# flavour: {flavour.tag} (python {flavour.python}, {flavour.abi.value})",
        "# The image's PIP_CONSTRAINT and UV_CONSTRAINT name this file: `pip install X` keeps these versions.",
        "# Opt out with an empty PIP_CONSTRAINT (`ENV PIP_CONSTRAINT=`), UV_CONSTRAINT for uv (docs/derived.md).",
    ]
    lines.extend(pins or _release_pins(flavour))
    return "\n".join(lines + _companion_lines(flavour, entries)) + "\n"


def _companion_lines(flavour: Flavour, entries: Iterable[LockEntry]) -> list[str]:
    """The companions the release records and the image does not install: pinned here only (a lock holds what the
    image installs, nothing else), so that `pip install torchvision` takes the one built for this torch. Their own
    requirements beyond the lock (torchvision's pillow) stay free: nothing in the image pins them."""
    locked = {canonicalize_name(entry.name) for entry in entries}
    missing = [(name, version) for name, version in flavour.companion_versions
               if canonicalize_name(name) not in locked and name not in flavour.companions]
    if not missing:
        return []
    lines = ["# Companions built for this torch (not installed; `./build.py update` learns them from the index):"]
    if not flavour.is_default_abi:
        lines.append(f"# the index's builds are {flavour.release_default_abi.title}: in this {flavour.abi.title} image "
                     "their extensions do not load (xla-images-check names them)")
    return lines + [f"{name}=={version}" for name, version in missing]


def _release_pins(flavour: Flavour) -> list[str]:
    """The flavour's packages without the wheel source's local labels (`torch==2.6.0` also matches 2.6.0+cxx11,
    PEP 440): render sees no site setting."""
    if flavour.is_nightly:
        pins = [f"torch{nightly_specifier(flavour.nightly_base)}", f"torch_xla{nightly_specifier(flavour.nightly_base)}"]
    else:
        pins = [f"torch=={flavour.torch}", f"torch_xla=={flavour.torch_xla}"]
    return pins + ([f"libtpu=={flavour.libtpu}"] if flavour.libtpu else []) \
        + [f"{name}=={version}" for name, version in flavour.installed_companions]


def constraints_digest(text: str) -> str:
    """The `sha256:<hex>` of a constraints file, as the image's label records it."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def parse_lock(text: str, where: str = LOCK_NAME) -> Lock:
    """Parse a lock file; any line that is neither a comment nor a pin is an error naming file:line."""
    inputs = None
    entries = []
    seen: dict[str, int] = {}  # canonical name -> line: a package pinned twice makes no sense to pip
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LOCK_LINE:  # before any regex: generated lines are ~200 characters
            raise ConfigError(f"line of {len(raw)} characters, longer than any lock line", rule="lock-format",
                              location=Location(where, number), hint="regenerate it with `./build.py lock`")
        line = raw.strip()
        match = _INPUTS_LINE.match(line)
        if match:
            inputs = match.group("inputs")
            continue
        if not line or line.startswith("#"):
            continue
        match = _LOCK_LINE.match(line)
        if not match or not match.group("filename"):
            raise ConfigError(f"not a lock line: {shown_value(raw, 100)}", location=Location(where, number),
                              rule="lock-format",
                              hint="locks are generated; regenerate it with `./build.py lock`")
        problem = _pin_problem(match.group("name"), match.group("version"), seen)
        if problem:
            raise ConfigError(problem, location=Location(where, number), rule="lock-format",
                              hint="locks are generated; regenerate it with `./build.py lock`")
        seen[canonicalize_name(match.group("name"))] = number
        entries.append(LockEntry(match.group("name"), match.group("version"), match.group("sha256"),
                                 match.group("filename"), bool(match.group("local"))))
    if inputs is None:
        raise ConfigError("the lock has no `# inputs: sha256:...` header line", location=Location(where),
                          rule="lock-format", hint="regenerate it with `./build.py lock`")
    return Lock(inputs, tuple(entries))


def _pin_problem(name: str, version: str, seen: dict[str, int]) -> str | None:
    """Why a pin cannot stand in a lock (a version pip cannot read, a package already pinned), or None."""
    try:
        Version(version)
    except InvalidVersion:
        return f"{shorten(name, 60)}=={shown_value(version, 60)}: not a version"
    earlier = seen.get(canonicalize_name(name))
    if earlier is not None:
        return f"{shorten(name, 60)} is pinned twice (also on line {earlier})"
    return None


def read_lock(path: Path) -> Lock:
    try:
        text = userfiles.read_text(path, limit=userfiles.LOCK_LIMIT)
    except ConfigError as error:
        if error.rule != "file-exists":
            raise  # a directory, fifo, binary or oversized file: named with its rule
        raise Failure(f"{path} does not exist", rule="lock-exists",
                      hint=f"run `./build.py lock {path.parent.name}`") from None
    return parse_lock(text, str(path))


def group_key(flavour: Target) -> tuple[str, str, str, WheelSource]:
    """Flavours with the same key resolve together: they differ only by accelerator (and so by libtpu)."""
    return flavour.python, flavour.abi.value, flavour.torch_xla, flavour.wheel_source


def group_requirements(flavours: Iterable[Target], flavour: Target) -> tuple[str, ...]:
    """The union of the requirements of `flavour`'s group among `flavours` (the whole plan)."""
    key = group_key(flavour)
    union = {pin for other in flavours if group_key(other) == key for pin in other.requirements}
    union.update(flavour.requirements)
    return tuple(sorted(union))


def is_pure_wheel(filename: str) -> bool:
    """A python-independent wheel (`py*-none-*` tag): the same file serves every python."""
    parts = filename.removesuffix(".whl").split("-")
    return len(parts) >= 5 and parts[-3].startswith("py") and parts[-2] == "none"


def release_family(flavour: Target) -> tuple[str, str, WheelSource]:
    """Targets that may share python-independent wheels: one release, ABI and wheel source, any python."""
    return flavour.abi.value, flavour.torch_xla, flavour.wheel_source


def anchor_python(flavours: Iterable[Target], flavour: Target) -> str:
    """The lowest python of `flavour`'s release family among `flavours` (the whole plan)."""
    family = release_family(flavour)
    pythons = {other.python for other in flavours if release_family(other) == family} | {flavour.python}
    return min(pythons, key=Version)


def unaligned(pins: Sequence[str]) -> str:
    """What a lock records instead of `pins` when they did not resolve for its python: it stays fresh until the
    anchor's pins change (then `lock` tries them again)."""
    return "unaligned:" + hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()


def lock_inputs(flavour: Target, resolved_with: Sequence[str]) -> str:
    """Hash of everything a lock is resolved from. Equal inputs, no reason to re-resolve."""
    payload = {
        "schema": LOCK_SCHEMA,
        "requirements": list(flavour.requirements),
        "resolved_with": sorted(resolved_with),
        "python": flavour.python,
        "platforms": list(PLATFORMS),
        "wheel_source": flavour.wheel_source.to_json(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"sha256:{digest}"


def unavailable_reason(site: Site, source: WheelSource, flavour: Target) -> str | None:
    """Why the wheels of `source` cannot be resolved on this site, or None when they can (as far as we know)."""
    wheelhouse = site.wheelhouse_path(source)
    if wheelhouse is not None and not wheelhouse.is_dir():
        return (f"wheel source {source.name} reads the wheelhouse {wheelhouse}, which does not exist; build the "
                f"wheels with {flavour.wheel_build.command} or point the source at existing wheels")
    return None

def host_wheel_dirs(site: Site, source: WheelSource) -> list[Path]:
    """Folders on the host the source takes wheels from directly (not through an index)."""
    folders = [Path(link) for link in source.find_links if "://" not in link]
    wheelhouse = site.wheelhouse_path(source)
    return folders + ([wheelhouse] if wheelhouse is not None else [])


def target_environment(python: str) -> dict[str, str]:
    """PEP 508 marker values inside an image of this python (CPython on x86_64 Linux)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
    }


def parse_requirement(text: str) -> Requirement:
    """A requirement line (`torch==2.9.0`, `setuptools; python_version >= \"3.12\"`) parsed, or a Failure."""
    try:
        return Requirement(text)
    except InvalidRequirement as error:
        raise Failure(f"cannot parse requirement {text!r}: {error}", rule="lock-resolve") from None


# --- which inputs a lock may be resolved from (the policy `lock` follows and freshness judges) ----------------

class LockPlan(Protocol):
    """What the policy reads of a plan (generate.plan.Plan): every flavour, and where each one's lock lives."""

    @property
    def flavours(self) -> tuple[Target, ...]: ...

    @property
    def site(self) -> Site: ...

    def lock_path(self, flavour: Target) -> Path: ...


@dataclass(frozen=True)
class Attempt:
    """One way to resolve a lock: pip is asked for `roots`; the lock records `recorded` as what it came from."""

    roots: tuple[str, ...]
    recorded: tuple[str, ...]
    together: bool  # with the flavour's group (False: the flavour alone)


def attempts(plan: LockPlan, flavour: Target) -> list[Attempt]:
    """The ways `flavour`'s lock may be resolved, in the order `lock` tries them."""
    group = group_requirements(plan.flavours, flavour)
    alone = flavour.requirements
    pins = aligned_pins(plan, flavour)
    if not pins:
        return [Attempt(group, group, True), Attempt(alone, alone, False)]
    marker = (unaligned(pins),)
    return [Attempt(group + pins, group + pins, True), Attempt(group, group + marker, True),
            Attempt(alone, alone + marker, False)]


def accepted_inputs(plan: LockPlan, flavour: Target) -> set[str]:
    """The `# inputs:` hashes a fresh lock of `flavour` may carry."""
    return {lock_inputs(flavour, attempt.recorded) for attempt in attempts(plan, flavour)}


def aligned_pins(plan: LockPlan, flavour: Target) -> tuple[str, ...]:
    """`name==version` of every python-independent wheel locked for the anchor python of `flavour`'s release.

    Empty for the anchor python itself and while its locks are missing or unreadable.
    """
    anchor = anchor_python(plan.flavours, flavour)
    if flavour.python == anchor:
        return ()
    family = [other for other in plan.flavours if release_family(other) == release_family(flavour)]
    # The requirement roots (torch, torch_xla, libtpu) are pinned by each flavour itself, some only in some.
    roots = {canonicalize_name(parse_requirement(text).name) for other in family for text in other.requirements}
    pins: set[str] = set()
    for other in family:
        if other.python != anchor:
            continue
        try:
            lock = read_lock(plan.lock_path(other))
        except XlaImagesError:
            continue
        pins.update(f"{entry.name}=={entry.version}" for entry in lock.entries
                    if is_pure_wheel(entry.filename) and entry.name not in roots)
    return tuple(sorted(pins))


# --- freshness: the committed lock against the inputs the matrix and site give now --------------------------

class LockState(enum.Enum):
    FRESH = "fresh"
    MISSING = "missing"
    STALE = "stale"
    UNAVAILABLE = "unavailable"  # no lock, and its wheels cannot be resolved on this site


@dataclass(frozen=True)
class LockStatus:
    state: LockState
    detail: str = ""


def lock_status(plan: LockPlan, flavour: Target) -> LockStatus:
    """Compare the committed lock with the inputs the matrix and site give now (no network)."""
    path = plan.lock_path(flavour)
    if not os.path.lexists(path):
        reason = unavailable_reason(plan.site, flavour.wheel_source, flavour)
        if reason:
            return LockStatus(LockState.UNAVAILABLE, f"unlocked (wheels not available here): {reason}")
        return LockStatus(LockState.MISSING, "no lock")
    try:
        lock = read_lock(path)
    except ConfigError as error:
        return LockStatus(LockState.STALE, f"unreadable ({error.message})")
    if lock.inputs not in accepted_inputs(plan, flavour):
        return LockStatus(LockState.STALE, "resolved from other inputs (requirements, python, platforms or "
                                           "wheel source changed since)")
    return LockStatus(LockState.FRESH)
