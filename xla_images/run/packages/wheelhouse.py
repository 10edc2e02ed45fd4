"""The host wheelhouse: `wheels fetch` downloads the locked wheels once, so builds can run without the index;
`wheels_for` finds them there for the build context (run.building.context). The locks themselves are
run.packages.lock's; pip is asked with the same options the resolution uses (target, source, CA).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ... import diskio
from ...errors import Failure
from ...generate.plan import Plan
from ...model.lockfile import Lock, LockEntry, read_lock
from ...model.site import Site
from ...model.target import Target
from .lock import Runner, _tail, cert_options, file_sha256, pip_environment, target_options

def wheel_dirs(plan: Plan, flavour: Target, wheelhouse: Path | None = None) -> list[Path]:
    """Where a flavour's wheels may be on the host: its source's wheelhouse first, then the fetch wheelhouse."""
    dirs = []
    source_dir = plan.site.wheelhouse_path(flavour.wheel_source)
    if source_dir is not None:
        dirs.append(source_dir)
    dirs.append(wheelhouse or default_wheelhouse(plan))
    return dirs


def default_wheelhouse(plan: Plan) -> Path:
    return plan.root / "wheelhouse"


def wheels_for(flavour: Target, lock: Lock | Path, wheelhouse: Path | Sequence[Path]) -> list[Path]:
    """The locked wheels of `flavour` found on the host (first folder wins), in lock order.

    Index wheels that are absent are simply not returned: pip downloads them during the build. A wheelhouse
    wheel (marked `(wheelhouse)` in the lock) that is absent is an error: no index has it. Hashes are not
    recomputed here (gigabytes); pip verifies every one with --require-hashes inside the build.
    """
    lock = read_lock(lock) if isinstance(lock, Path) else lock
    dirs = [Path(wheelhouse)] if isinstance(wheelhouse, (str, Path)) else [Path(item) for item in wheelhouse]
    found, absent = [], []
    for entry in lock.entries:
        path = next((folder / entry.filename for folder in dirs if (folder / entry.filename).is_file()), None)
        if path is not None:
            found.append(path)
        elif entry.local:
            absent.append(entry.filename)
    if absent:
        raise Failure(f"{flavour.tag} needs wheels that are in no wheelhouse: {', '.join(absent)}",
                      rule="wheelhouse-complete",
                      hint=f"build them with {flavour.wheel_build.command} (looked in "
                           f"{', '.join(str(folder) for folder in dirs)})")
    return found


@dataclass(frozen=True)
class FetchResult:
    downloaded: tuple[str, ...]
    present: int
    bytes: int


def fetch(plan: Plan, flavours: Sequence[Target], wheelhouse: Path | None = None, *,
          runner: Runner = subprocess.run, progress: Callable[[str], None] = lambda message: None) -> FetchResult:
    """Download the locked wheels of `flavours` into the host wheelhouse, each file once, verifying sha256."""
    destination = wheelhouse or default_wheelhouse(plan)
    diskio.make_directory(destination)  # an existing file there is a disk-type error naming it
    verified: dict[Path, str] = {}
    downloaded: list[str] = []
    present = 0
    for flavour in flavours:
        lock = read_lock(plan.lock_path(flavour))
        dirs = wheel_dirs(plan, flavour, destination)
        wanted = []
        for entry in lock.entries:
            if entry.filename in downloaded or _verified_somewhere(entry, dirs, verified):
                present += entry.filename not in downloaded
                continue
            if entry.local:
                raise Failure(f"{entry.filename} (locked for {flavour.tag}) is in no wheelhouse with the locked "
                              "hash", rule="wheelhouse-complete",
                              hint=f"build it with {flavour.wheel_build.command}, or re-lock")
            wanted.append(entry)
        if wanted:
            progress(f"{flavour.tag}: downloading {len(wanted)} wheel(s)")
            _pip_download(plan.site, flavour, wanted, destination, runner)
            for entry in wanted:
                path = destination / entry.filename
                if not path.is_file() or file_sha256(path) != entry.sha256:
                    raise Failure(f"{path} is missing or does not match its locked sha256 after download",
                                  rule="wheel-hash", hint="delete it and fetch again; re-lock if the index changed")
                downloaded.append(entry.filename)
    size = sum((destination / name).stat().st_size for name in downloaded)
    return FetchResult(tuple(downloaded), present, size)


def _verified_somewhere(entry: LockEntry, dirs: Sequence[Path], verified: dict[Path, str]) -> bool:
    for folder in dirs:
        path = folder / entry.filename
        if path.is_file():
            if path not in verified:
                verified[path] = file_sha256(path)
            if verified[path] == entry.sha256:
                return True
    return False


def _pip_download(site: Site, flavour: Target, entries: Sequence[LockEntry], destination: Path,
                  runner: Runner) -> None:
    with tempfile.TemporaryDirectory(prefix="xla-images-fetch-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text("".join(entry.line() + "\n" for entry in entries), encoding="utf-8")
        command = [sys.executable, "-m", "pip", "--no-input", "--disable-pip-version-check",
                   "download", "--quiet", "--no-deps", "--require-hashes", "--dest", str(destination),
                   *target_options(flavour.python), *cert_options(site), "-r", str(requirements)]
        result = runner(command, capture_output=True, text=True, check=False,
                        env=pip_environment(site, flavour.wheel_source))
    if result.returncode != 0:
        raise Failure(f"pip could not download the wheels of {flavour.tag}:\n{_tail(result.stderr)}",
                      rule="wheel-download", hint="check the network and CA bundle; re-lock if the index changed")
