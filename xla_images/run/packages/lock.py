"""Locks, made and checked: the one run module for them (what a lock is, its inputs and freshness: model.lockfile).

`lock` resolves a target's wheels without installing anything and writes Dockerfiles/<tag>/requirements.lock.
`stale`, `require_fresh` (build, bake) and `check_layouts` (lock, render --check) check committed locks. The
host wheelhouse the locked wheels are fetched into is run.packages.wheelhouse.

How resolution works, and why:
* pip does it (`install --dry-run --ignore-installed --report -`), with no config file and none of the host's
  PIP_* variables (constraint files, indexes) leaking in, the sources in its environment (pip_environment), the site's CA via `--cert`, and the target's python,
  ABI and platforms (`--python-version --implementation cp --abi cpXY --platform ...` + `--only-binary=:all:`).
  `--use-feature=fast-deps` reads each wheel's METADATA with HTTP range requests instead of downloading
  gigabytes of CUDA wheels (measured: 17 s instead of 35-100 s for torch 2.9).
* pip evaluates environment markers against the python running it, not the target (`--python-version` only
  affects Requires-Python and tags). So the closure is recomputed here from the report's `requires_dist` with the
  TARGET's marker environment: what the host alone needed is dropped; what only the target needs (torch wants
  `setuptools; python_version >= "3.12"`) is added as a root and pip resolves again (at most a few rounds).
  Every pin is then checked against every requirement that reaches it.
* Flavours that differ only by accelerator (same python, ABI, torch_xla and wheel source) are resolved together
  once, with the union of their requirements, and each lock is its flavour's closure within that resolution:
  half the work, and cpu and tpu images of a release get the same versions. The union is part of the lock's
  inputs hash, so the result does not depend on which flavours one asked to lock. When a group cannot resolve
  together (a tpu pin without a wheel for that python), each member is resolved alone; such a lock records
  its own requirements as what it was resolved with, and counts as fresh too.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ... import settings
from ...errors import Failure, XlaImagesError
from ...generate.plan import Plan
from ...generate import render
from ...generate.sync import write_if_changed
from ...model.lockfile import (PLATFORMS, LockEntry, LockState, anchor_python, attempts, format_lock, group_key,
                               host_wheel_dirs, lock_inputs, lock_status, parse_requirement, release_family,
                               target_environment, unavailable_reason)
from ...model.site import Site, WheelSource
from ...model.target import Target
from . import layout

# Rounds of "pip resolves, we add what the target's markers need": one is the norm, two when python differs.
MAX_ROUNDS = 4
PIP_FAST_DEPS = "--use-feature=fast-deps"


# --- resolution ---------------------------------------------------------------------------------------------

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass
class Resolver:
    """Resolves lock entries with pip. `runner` is subprocess.run; tests of error paths may replace it."""

    site: Site
    runner: Runner = subprocess.run
    pip: tuple[str, ...] = (sys.executable, "-m", "pip")
    # (python, source, roots) -> report items: flavours that resolve identically share one pip run.
    _cache: dict[tuple, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def resolve(self, flavours: Sequence[Target], roots: Sequence[str]) -> dict[str, list[LockEntry]]:
        """Lock entries for each of `flavours` (one group) from one resolution of `roots`, by tag."""
        first = flavours[0]
        environment = target_environment(first.python)
        pip_roots = list(roots)
        for _ in range(MAX_ROUNDS):
            items = self._report(first, tuple(pip_roots))
            closures = {flavour.tag: closure(items, flavour.requirements, environment) for flavour in flavours}
            missing = sorted({req for result in closures.values() for req in result.missing} - set(pip_roots))
            if not missing:
                break
            # Needed only under the target's markers: let pip resolve them with the rest.
            pip_roots.extend(missing)
        else:
            raise Failure(f"resolution for python {first.python} did not settle after {MAX_ROUNDS} rounds "
                          f"(still missing: {', '.join(missing)})", rule="lock-resolve")
        problems = [problem for result in closures.values() for problem in result.conflicts]
        if problems:
            raise Failure(f"pip's resolution does not satisfy python {first.python}'s requirements: "
                          + "; ".join(sorted(set(problems))), rule="lock-resolve",
                          hint="a dependency needs different versions on the host's python and the target's; "
                               "lock on a host with python " + first.python)
        local_dirs = host_wheel_dirs(self.site, first.wheel_source)
        return {tag: [self._entry(items[name], local_dirs) for name in result.names]
                for tag, result in closures.items()}

    def _report(self, flavour: Target, roots: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        key = (flavour.python, flavour.wheel_source, roots)
        if key not in self._cache:
            report = self._run_pip(flavour, roots)
            self._cache[key] = {canonicalize_name(item["metadata"]["name"]): item
                                for item in report.get("install", [])}
        return self._cache[key]

    def _run_pip(self, flavour: Target, roots: Sequence[str]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="xla-images-lock-") as scratch:
            command = [
                *self.pip, "--no-input", "--disable-pip-version-check", "install",
                "--dry-run", "--ignore-installed", "--quiet", "--report", "-", "--target", scratch,
                PIP_FAST_DEPS, *target_options(flavour.python),
                *cert_options(self.site), *roots,
            ]
            result = self.runner(command, capture_output=True, text=True, check=False,
                                 env=pip_environment(self.site, flavour.wheel_source))
        if result.returncode != 0:
            raise Failure(f"pip could not resolve {' '.join(roots)} for python {flavour.python} "
                          f"from wheel source {flavour.wheel_source.name}:\n{_tail(result.stderr)}",
                          rule="lock-resolve",
                          hint=f"every pin needs a wheel for python {flavour.python} on x86_64 Linux (pip lists "
                               "the versions it found): fix the pin or exclude the flavour in matrix.yaml, or fix "
                               "the wheel source; behind a TLS-intercepting proxy set ca_bundle")
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            raise Failure("pip printed no installation report", rule="lock-resolve",
                          hint="this needs pip >= 23 (install --dry-run --report)") from None

    def _entry(self, item: dict[str, Any], local_dirs: Sequence[Path]) -> LockEntry:
        url = item["download_info"]["url"]
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        sha256 = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)) if url.startswith("file:") else None
        # From a wheelhouse (or local find-links folder): no index has it, builds need the file itself.
        local = path is not None and any(path.resolve().parent == folder.resolve() for folder in local_dirs)
        if sha256 is None and path is not None:
            sha256 = file_sha256(path)
        if sha256 is None:
            raise Failure(f"the wheel source gave no sha256 for {filename}", rule="lock-hash",
                          hint="use an index that publishes hashes (PEP 503 #sha256= fragments)")
        return LockEntry(canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"], sha256, filename,
                         local)


def file_sha256(path: Path) -> str:
    """A host wheel's sha256, read in blocks (lock: a local wheel pip reported no hash for; wheelhouse: a copy
    checked against its lock entry)."""
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def target_options(python: str) -> list[str]:
    """pip options that make it choose wheels for the image, not for the host."""
    options = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
               "--abi", f"cp{python.replace('.', '')}"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def pip_environment(site: Site, source: WheelSource) -> dict[str, str]:
    """The environment of every pip this module starts: where the wheels come from, and nothing of the host's pip.

    Index URLs may carry credentials, and a command line is world-readable (/proc/PID/cmdline, `ps`) while a
    process's environment is its owner's only: the sources go in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL /
    PIP_FIND_LINKS, never in argv. `--isolated` would ignore them, so the isolation it gave is made here: no
    config file (PIP_CONFIG_FILE=os.devnull, as pip documents) and none of the host's PIP_* variables."""
    environment = {key: value for key, value in settings.child_environment().items()
                   if not key.upper().startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    if source.index_url:
        environment["PIP_INDEX_URL"] = source.index_url
    if source.extra_index_urls:
        environment["PIP_EXTRA_INDEX_URL"] = " ".join(source.extra_index_urls)
    # pip splits these variables on whitespace: local folders go as file: URLs (a space is %20 there).
    links = [link if "://" in link else Path(os.path.abspath(link)).as_uri() for link in source.find_links]
    wheelhouse = site.wheelhouse_path(source)
    if wheelhouse is not None:
        links.append(Path(os.path.abspath(wheelhouse)).as_uri())
    if links:
        environment["PIP_FIND_LINKS"] = " ".join(links)
    return environment


def cert_options(site: Site) -> list[str]:
    ca = site.ca_bundle()
    return ["--cert", str(ca)] if ca else []


@dataclass
class Closure:
    names: list[str]
    missing: list[str]  # requirements (marker stripped) the target needs that the resolution lacks
    conflicts: list[str]


def closure(items: dict[str, dict[str, Any]], roots: Iterable[str], environment: dict[str, str]) -> Closure:
    """The dists reachable from `roots` when markers are evaluated for `environment`, checked against the pins."""
    names: list[str] = []
    missing: list[str] = []
    conflicts: list[str] = []
    seen: set[tuple[str, str]] = set()
    todo = [(parse_requirement(root), "the flavour") for root in roots]
    while todo:
        requirement, wanted_by = todo.pop()
        name = canonicalize_name(requirement.name)
        item = items.get(name)
        if item is None:
            missing.append(_without_marker(requirement))
            continue
        version = item["metadata"]["version"]
        if not _satisfies(requirement, version):
            conflicts.append(f"{wanted_by} needs {requirement}, resolved {name} {version}")
        if name not in names:
            names.append(name)
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for text in item["metadata"].get("requires_dist") or []:
                dependency = parse_requirement(text)
                marker = dependency.marker
                if marker is None or marker.evaluate({**environment, "extra": extra}):
                    todo.append((dependency, f"{name} {version}"))
    return Closure(sorted(names), sorted(set(missing)), conflicts)




def _without_marker(requirement: Requirement) -> str:
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}{requirement.specifier}"


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _tail(text: str, lines: int = 15) -> str:
    kept = [line for line in text.strip().splitlines() if "fast-deps" not in line]
    return "\n".join("  " + line for line in kept[-lines:])


# --- the lock command ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LockResult:
    tag: str
    path: Path
    wheels: int
    seconds: float
    changed: bool
    shared_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    tag: str
    reason: str


@dataclass(frozen=True)
class GroupFailure:
    tags: tuple[str, ...]
    error: XlaImagesError


@dataclass(frozen=True)
class LockReport:
    locked: tuple[LockResult, ...]
    skipped: tuple[Skipped, ...]
    failed: tuple[GroupFailure, ...]


def lock(plan: Plan, flavours: Sequence[Target], *, jobs: int = 2, resolver: Resolver | None = None,
         progress: Callable[[str], None] = lambda message: None) -> LockReport:
    """Resolve and write the locks of `flavours`; release families run `jobs` at a time.

    A release family (one torch_xla, ABI and wheel source) is locked python by python, the lowest first; the
    others are resolved with that python's python-independent pins too, falling back to a free resolution where
    those pins do not resolve (model.lockfile.attempts: the attempts, in order). A group that fails (say, a pin
    with no wheel for its python) does not stop the others: every lock that can be made is written, and the
    failures are reported together.
    """
    locking = _Locking(plan, resolver or Resolver(plan.site), progress)
    skipped, groups = [], {}
    for flavour in flavours:
        reason = unavailable_reason(plan.site, flavour.wheel_source, flavour)
        if reason:
            skipped.append(Skipped(flavour.tag, reason))
        else:
            groups.setdefault(group_key(flavour), []).append(flavour)
    families: dict[tuple, list[list[Target]]] = {}
    for members in groups.values():
        families.setdefault(release_family(members[0]), []).append(members)
    for members_by_python in families.values():
        members_by_python.sort(key=lambda members: Version(members[0].python))
    locked: list[LockResult] = []
    failed: list[GroupFailure] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for results, failures in pool.map(locking.family, families.values()):
            locked.extend(results)
            failed.extend(failures)
    return LockReport(tuple(locked), tuple(skipped), tuple(failed))


@dataclass(frozen=True)
class _Locking:
    """One `lock` run: resolve a group's locks the ways model.lockfile.attempts allows, in order, and write them."""

    plan: Plan
    resolver: Resolver
    progress: Callable[[str], None]

    def resolve_and_write(self, members: list[Target], roots: Sequence[str],
                          recorded: Sequence[str]) -> list[LockResult]:
        plan = self.plan
        started = time.monotonic()
        entries = self.resolver.resolve(members, roots)
        seconds = time.monotonic() - started
        written = []
        for flavour in members:
            text = format_lock(flavour, lock_inputs(flavour, recorded), entries[flavour.tag])
            changed = write_if_changed(plan.lock_path(flavour), text, plan.root)
            # The constraints file and the Dockerfile's label of its sha256 are made from the lock: a new lock
            # renders them again, so `render --check` finds no drift after `lock`.
            for name, rendered in render.render_flavour(flavour, text).items():
                write_if_changed(plan.flavour_dir(flavour) / name, rendered, plan.root)
            others = tuple(other.tag for other in members if other is not flavour)
            written.append(LockResult(flavour.tag, plan.lock_path(flavour), len(entries[flavour.tag]), seconds,
                                      changed, others))
        self.progress(f"resolved {' + '.join(flavour.tag for flavour in members)} in {seconds:.1f}s")
        return written

    def group(self, members: list[Target]) -> tuple[list[LockResult], list[GroupFailure]]:
        # The anchor python's group ran before this one (family): its lock gives the pins (model.lockfile).
        together = [attempt for attempt in attempts(self.plan, members[0]) if attempt.together]
        tags = " + ".join(flavour.tag for flavour in members)
        for number, attempt in enumerate(together):
            try:
                return self.resolve_and_write(members, attempt.roots, attempt.recorded), []
            except XlaImagesError as error:
                if number + 1 < len(together):
                    self.progress(f"{tags}: the python-independent pins of python "
                                  f"{anchor_python(self.plan.flavours, members[0])} do not resolve here "
                                  f"({error.message.splitlines()[0]}); resolving without them (torch-any not shared)")
                elif len(members) == 1:
                    self.progress(f"FAILED {members[0].tag}")
                    return [], [GroupFailure((members[0].tag,), error)]
        # Together they do not resolve (say, the tpu sibling's libtpu has no wheel for this python): whoever
        # resolves alone still gets a lock, recorded as resolved from its own requirements.
        self.progress(f"{tags} do not resolve together; trying each alone")
        return self.each_alone(members)

    def each_alone(self, members: list[Target]) -> tuple[list[LockResult], list[GroupFailure]]:
        results, failures = [], []
        for flavour in members:
            alone = attempts(self.plan, flavour)[-1]
            try:
                results += self.resolve_and_write([flavour], alone.roots, alone.recorded)
            except XlaImagesError as error:
                self.progress(f"FAILED {flavour.tag}")
                failures.append(GroupFailure((flavour.tag,), error))
        return results, failures

    def family(self, members_by_python: list[list[Target]]) -> tuple[list[LockResult], list[GroupFailure]]:
        # The anchor (lowest) python first: the others are resolved with the pins its lock has then.
        results, failures = [], []
        for members in members_by_python:
            more_results, more_failures = self.group(members)
            results += more_results
            failures += more_failures
        return results, failures


# --- checking locks: fresh (no network) and their layer layouts ---------------------------------------------

def stale(plan: Plan, flavours: Iterable[Target]) -> list[Target]:
    """The flavours whose committed lock is missing, stale or cannot be made here (`lock --stale-only`)."""
    return [flavour for flavour in flavours if lock_status(plan, flavour).state is not LockState.FRESH]


def require_fresh(plan: Plan, flavour: Target) -> None:
    """`build`'s check: the committed lock is the one the matrix and site ask for now, else rule lock-fresh."""
    status = lock_status(plan, flavour)
    if status.state is LockState.FRESH:
        return
    what = "has no lock" if status.state is not LockState.STALE else "has a stale lock"
    raise Failure(f"{flavour.tag} {what}: {status.detail}", location=str(plan.lock_path(flavour)),
                  rule="lock-fresh", hint=f"run `./build.py lock {flavour.tag}` and commit the lock")


def check_layouts(plan: Plan, flavours: Iterable[Target], *, offline: bool = False,
                  progress: Callable[[str], None] = lambda message: None) -> list[layout.LayoutResult]:
    """Every lock's layer layout (run.packages.layout), checked before any engine work; an error if one fails."""
    results = layout.check_locks(plan, flavours, offline=offline, progress=progress)
    layout.require_clean(results)
    return results
