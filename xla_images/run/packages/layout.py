"""The layer layout of every lock, computed and checked on the host before any engine work.

The wheels stage of an image splits the installed venv into layers with xla_images/layers.py. That split has
to give trees that apply cleanly one over the other (COPY cannot delete a file of a lower layer or change its
type: `cannot replace to directory ... with file`), so a layout that would break is found here, from the lock
alone: each locked wheel's METADATA (Requires-Dist), WHEEL (tags) and RECORD (its files) are read -- from the
host wheelhouse when the wheel is there, else from the index with HTTP range requests on the zip's central
directory through run.packages.index (a torch wheel is ~900 MB; its RECORD and METADATA are a few hundred KB at the end
of it) -- and
layers.plan / layers.check run on them exactly as the image runs them on the installed files.

Facts are cached by the wheel's sha256 (immutable content) under $XLA_IMAGES_CACHE or ~/.cache/xla-images, so a
second check needs no network. So is each flavour's verdict, under everything it is a function of (the lock's
wheels, the python, the roots, the marker environment, the code that plans and checks): planning and checking
~400,000 paths for the 25 committed locks took 8.5 s of every `render --check`, which now takes 0.5 s once they
have been checked. What the host cannot know is the venv's bootstrap (ensurepip's pip and setuptools, installed
in the same stage before the lock and grouped below it: nothing of the lock can clash with a lower layer because
of it); the base is modelled as the bare venv skeleton (VENV_SKELETON).
"""
from __future__ import annotations

import email.parser
import functools
import hashlib
import importlib.metadata
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

from ... import diskio, layers, names, userfiles
from ...cache import cache_dir
from ...errors import Failure, XlaImagesError
from ...generate.plan import Plan
from ...model.lockfile import Lock, LockEntry, host_wheel_dirs, read_lock, target_environment
from ...model.site import Site, WheelSource
from ...model.target import Target
from ...model.wheel_index import PUBLIC_INDEX
from .index import Index, IndexFile

CACHE_VERSION = 1
# A RECORD or METADATA larger than this is not a wheel's (torch's RECORD is ~2 MB).
MAX_MEMBER = 32 << 20
# What `python -m venv --without-pip` leaves in the base layer (relative to the venv), with the entry's kind.
VENV_SKELETON = {"bin/python": layers.SYMLINK, "lib64": layers.SYMLINK, "pyvenv.cfg": layers.FILE}


@dataclass(frozen=True)
class WheelFacts:
    """What the layer split needs of one wheel, cached by its sha256."""

    requires: tuple[str, ...]
    tags: tuple[str, ...]
    record: tuple[str, ...]  # RECORD paths as the wheel lists them (before install-time .data mapping)

    def to_json(self) -> dict[str, Any]:
        return {"version": CACHE_VERSION, "requires": list(self.requires), "tags": list(self.tags),
                "record": list(self.record)}

    @classmethod
    def from_json(cls, data: Any) -> "WheelFacts | None":
        """None for anything that is not what to_json wrote (a damaged cache entry is fetched again)."""
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            return None
        fields = [data.get(key) for key in ("requires", "tags", "record")]
        if not all(isinstance(value, list) and all(isinstance(item, str) for item in value) for value in fields):
            return None
        return cls(*(tuple(value) for value in fields))


# --- reading a wheel --------------------------------------------------------------------------------------

DIST_INFO_MEMBERS = ("METADATA", "WHEEL", "RECORD")


def _dist_info_member(member: str) -> Callable[[str], bool]:
    """Accepts `<name>-<version>.dist-info/<member>` at the top of the wheel."""
    def wanted(name: str) -> bool:
        parts = PurePosixPath(name).parts
        return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == member
    return wanted


def read_wheel(handle: Any, where: str) -> WheelFacts:
    """Requires-Dist, tags and RECORD paths of a wheel file on the host (zipfile reads its tail, not all)."""
    try:
        archive = zipfile.ZipFile(handle)
        texts: dict[str, str | None] = {}
        for member in DIST_INFO_MEMBERS:
            info = next((info for info in archive.infolist() if _dist_info_member(member)(info.filename)), None)
            if info is not None and info.file_size > MAX_MEMBER:
                raise Failure(f"{where}: .dist-info/{member} is {info.file_size} bytes", rule="layout-wheel")
            texts[member] = None if info is None else archive.read(info).decode("utf-8")
    except (zipfile.BadZipFile, UnicodeDecodeError, OSError, EOFError) as error:
        raise Failure(f"{where} is not a readable wheel: {error}", rule="layout-wheel") from None
    return facts_from(texts, where)


def facts_from(texts: dict[str, str | None], where: str) -> WheelFacts:
    missing = [member for member in DIST_INFO_MEMBERS if texts.get(member) is None]
    if missing:
        raise Failure(f"{where}: no .dist-info/{missing[0]}", rule="layout-wheel")
    metadata = email.parser.Parser().parsestr(texts["METADATA"] or "", headersonly=True)
    wheel = email.parser.Parser().parsestr(texts["WHEEL"] or "", headersonly=True)
    record = tuple(line.split(",", 1)[0] for line in (texts["RECORD"] or "").splitlines() if line.strip())
    return WheelFacts(tuple(metadata.get_all("Requires-Dist") or ()), tuple(wheel.get_all("Tag") or ()), record)


# --- finding a wheel ------------------------------------------------------------------------------------

class WheelFinder:
    """Facts of the wheels a site's sources serve: cache, host folders, then the indexes."""

    def __init__(self, site: Site, *, offline: bool = False) -> None:
        self.site = site
        self.offline = offline
        ca = site.ca_bundle()
        self.ca_bundle = str(ca) if ca else None
        self.indexes: dict[str, Index] = {}
        self.pages: dict[str, dict[str, dict[str, IndexFile]]] = {}  # index -> project -> filename -> file
        self.memo: dict[str, WheelFacts] = {}
        self.fetched = 0

    def facts(self, entry: LockEntry, source: WheelSource) -> WheelFacts | None:
        """None when offline and nothing local or cached has them."""
        if entry.sha256 in self.memo:
            return self.memo[entry.sha256]
        found = self._find(entry, source)
        if found is not None:
            self.memo[entry.sha256] = found
        return found

    def _find(self, entry: LockEntry, source: WheelSource) -> WheelFacts | None:
        cached = self._cached(entry.sha256)
        if cached is not None:
            return cached
        for folder in host_wheel_dirs(self.site, source):
            path = folder / entry.filename
            if path.is_file():
                with path.open("rb") as handle:  # a regular file: zipfile reads its tail, never all of it
                    return self._store(entry.sha256, read_wheel(handle, str(path)))
        if self.offline:
            return None
        self.fetched += 1
        return self._store(entry.sha256, self._remote(entry, source))

    def _cached(self, sha256: str) -> WheelFacts | None:
        path = cache_dir() / "wheel-facts" / f"{sha256}.json"
        try:
            return WheelFacts.from_json(json.loads(userfiles.read_text(path, limit=MAX_MEMBER * 2)))
        except (XlaImagesError, ValueError, RecursionError):
            return None

    def _store(self, sha256: str, facts: WheelFacts) -> WheelFacts:
        folder = cache_dir() / "wheel-facts"
        try:
            diskio.write_text_atomic(folder / f"{sha256}.json", json.dumps(facts.to_json()),
                                     "a wheel-facts cache entry", root=cache_dir())
        except XlaImagesError:
            pass  # a cache that cannot be written only costs the next check its network time
        return facts

    def _remote(self, entry: LockEntry, source: WheelSource) -> WheelFacts:
        """From the first of the source's indexes that lists the file: range requests only (run.packages.index)."""
        urls = [source.index_url or PUBLIC_INDEX, *source.extra_index_urls]
        refused: list[Failure] = []  # an index that does not list the project at all: the next may
        for url in urls:
            if url not in self.indexes:
                self.indexes[url] = Index(url, ca_bundle=self.ca_bundle)
            index = self.indexes[url]
            if entry.name not in self.pages.setdefault(url, {}):
                try:
                    self.pages[url][entry.name] = {file.filename: file for file in index.files(entry.name)}
                except Failure as error:
                    refused.append(error)
                    continue
            file = self.pages[url][entry.name].get(entry.filename)
            if file is not None:
                return facts_from({member: index.wheel_member(file, _dist_info_member(member))
                                   for member in DIST_INFO_MEMBERS}, file.url)
        if refused and len(refused) == len(urls):
            raise refused[0]
        raise Failure(f"{entry.filename} is on none of {', '.join(urls)}", rule="layout-index",
                      hint="re-lock (`./build.py lock`), or fetch the wheels into a wheelhouse (`wheels fetch`)")


# --- the check ------------------------------------------------------------------------------------------

def dists_of(flavour: Target, lock: Lock, facts: dict[str, WheelFacts]) -> dict[str, layers.Dist]:
    """The layer split's view of a lock's wheels once pip has installed them into the image's venv."""
    site_packages = _site_packages(flavour.python)
    dists = {}
    for entry in lock.entries:
        wheel = facts[entry.sha256]
        name = layers.canonical(entry.name)
        files = tuple(_installed_path(path, site_packages, flavour.python) for path in wheel.record)
        dists[name] = layers.Dist(name, entry.version, wheel.requires, layers.is_pure_tags(list(wheel.tags)),
                                  files)
    return dists


def _site_packages(python: str) -> Path:
    return Path(names.VENV) / "lib" / f"python{python}" / "site-packages"


def _installed_path(record_path: str, site_packages: Path, python: str) -> Path:
    """Where pip puts a RECORD path of the wheel (the .data/ scheme directories mapped as pip maps them)."""
    parts = PurePosixPath(record_path).parts
    if len(parts) > 2 and parts[0].endswith(".data"):
        scheme, rest = parts[1], PurePosixPath(*parts[2:])
        venv = Path(names.VENV)
        project = parts[0].removesuffix(".data").rsplit("-", 1)[0]
        roots = {"purelib": site_packages, "platlib": site_packages, "scripts": venv / "bin", "data": venv,
                 "headers": venv / "include" / "site" / f"python{python}" / project}
        return Path(os.path.normpath(roots.get(scheme, site_packages) / rest))
    return Path(os.path.normpath(f"{site_packages}/{record_path}"))


@dataclass(frozen=True)
class LayoutResult:
    tag: str
    problems: tuple[str, ...]
    checked: bool  # False: offline, and some wheel's facts were neither local nor cached


def check_flavour(flavour: Target, lock_path: Path, finder: WheelFinder) -> LayoutResult:
    lock = read_lock(lock_path)
    key = verdict_key(flavour, lock)
    cached = _cached_verdict(key)
    if cached is not None:
        return LayoutResult(flavour.tag, cached, True)
    result = _checked_flavour(flavour, lock, finder)
    if result.checked:
        _store_verdict(key, result.problems)
    return result


def _checked_flavour(flavour: Target, lock: Lock, finder: WheelFinder) -> LayoutResult:
    facts = {}
    for entry in lock.entries:
        found = finder.facts(entry, flavour.wheel_source)
        if found is None:
            return LayoutResult(flavour.tag, (), False)
        facts[entry.sha256] = found
    dists = dists_of(flavour, lock, facts)
    roots = [layers.root_name(root) for root in flavour.layer_requirements]
    try:
        layout = layers.plan(roots, dists, set(dists), _site_packages(flavour.python),
                             target_environment(flavour.python))
    except layers.LayoutError as error:
        return LayoutResult(flavour.tag, (str(error),), True)
    base = {Path(names.VENV) / path: kind for path, kind in VENV_SKELETON.items()}
    return LayoutResult(flavour.tag, tuple(layers.check(layout, base)), True)


# --- verdicts kept by what they are a function of ----------------------------------------------------------

VERDICTS = "layout-verdicts"


@functools.cache
def _code_digest() -> str:
    """This module's and the split's source, and the version of the packaging that evaluates their markers
    (pip's vendored copy where pip is importable): a change to how layouts are planned or checked is a new key."""
    digest = hashlib.sha256()
    for source in (Path(str(layers.__file__)), Path(__file__)):
        digest.update(source.read_bytes())
    provider = layers.Requirement.__module__.partition(".")[0]
    digest.update(f"{provider} {importlib.metadata.version(provider)}".encode())
    return digest.hexdigest()


def verdict_key(flavour: Target, lock: Lock) -> str:
    """The sha256 of everything check_flavour's answer depends on. A wheel's facts are named by its sha256."""
    inputs = {"code": _code_digest(), "venv": names.VENV, "python": flavour.python,
              "roots": [layers.root_name(root) for root in flavour.layer_requirements],
              "environment": target_environment(flavour.python),
              "wheels": [[entry.name, entry.version, entry.sha256] for entry in lock.entries]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _cached_verdict(key: str) -> tuple[str, ...] | None:
    """The problems found before under `key`; None when there is no entry, or one that is not ours."""
    path = cache_dir() / VERDICTS / f"{key}.json"
    try:
        data = json.loads(userfiles.read_text(path, limit=MAX_MEMBER))
    except (XlaImagesError, ValueError, RecursionError):  # damaged: checked again, and written anew
        return None
    problems = data.get("problems") if isinstance(data, dict) and data.get("version") == CACHE_VERSION else None
    if not isinstance(problems, list) or not all(isinstance(problem, str) for problem in problems):
        return None
    return tuple(problems)


def _store_verdict(key: str, problems: tuple[str, ...]) -> None:
    try:
        diskio.write_text_atomic(cache_dir() / VERDICTS / f"{key}.json",
                                 json.dumps({"version": CACHE_VERSION, "problems": list(problems)}),
                                 "a layout-verdict cache entry", root=cache_dir())
    except XlaImagesError:
        pass  # a cache that cannot be written only costs the next check its time


def check_locks(plan: Plan, flavours: Iterable[Target], *, offline: bool = False,
                progress: Callable[[str], None] = lambda line: None) -> list[LayoutResult]:
    """The layout of every flavour whose lock exists; a lock shared by cpu and tpu reads its wheels once."""
    finder = WheelFinder(plan.site, offline=offline)
    results = []
    for flavour in flavours:
        lock_path = plan.lock_path(flavour)
        if not lock_path.is_file():
            continue
        results.append(check_flavour(flavour, lock_path, finder))
    if finder.fetched:
        progress(f"layout: read {finder.fetched} wheel(s) from the index (cached in {cache_dir()})")
    return results


def require_clean(results: Iterable[LayoutResult]) -> None:
    """A Failure naming each flavour's paths when any layout would not apply cleanly."""
    broken = [result for result in results if result.problems]
    if broken:
        lines = [f"{result.tag}: {problem}" for result in broken for problem in result.problems[:10]]
        raise Failure(f"{len(broken)} flavour(s) would build layers that do not apply cleanly:\n  "
                      + "\n  ".join(lines), rule="layer-layout",
                      hint="a wheel changes the type of a path another layer holds; see docs/images.md, "
                           "\"Layers that flavours share\"")
