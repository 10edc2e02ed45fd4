"""The one place generated files meet the disk: what `render` writes, and what `render --check` reports.

Every file xla-images generates goes through here, whichever command made it:

* rendered and committed (`expected_files`): Dockerfiles/<tag>/Dockerfile, wheel-builds/<build>.env, the CI
  files (ci/github/*.yml, docker-bake.json), schemas/*.schema.json and docs/rules.md. `write` writes those
  that differ and removes orphans; `check` reports each as missing, stale or orphan. `ci github|bake
  [--check]` use the same `write_files`/`drift` on their part of the set.
* resolved, not rendered: Dockerfiles/<tag>/requirements.lock. `lock` (run.packages.lock) writes it with
  `write_if_changed`; its freshness is its `# inputs:` header against what the plan asks now (`model.lockfile.lock_status`),
  so `check` needs no network.

Contract: a write never leaves half a file (diskio.write_text_atomic: an exclusive temporary file beside it,
then a rename, Ctrl-C held back meanwhile); a file is written only when its text differs; every write and
removal stays inside the repository, through no symlink (a symlinked `Dockerfiles/`, flavour folder or
generated file is a `disk-symlink` error naming it, a file where a folder belongs `disk-type`); a directory or
file is deleted only when it carries GENERATED_MARK and is no link, so nothing a user wrote is removed; every
read is bounded (userfiles: a fifo, device, link, huge or non-UTF-8 file is reported, never read through);
`check` writes nothing and asks no network.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import diskio, userfiles
from ..errors import ConfigError
from ..model import lockfile
from ..names import CONSTRAINTS_NAME, DOCKERFILES, GENERATED_MARK, LOCK_NAME, WHEEL_BUILD_SCRIPT, WHEEL_BUILDS_DIR
from . import cigen, render, rulesdoc, schemas
from .plan import Plan
from .render import RENDER_COMMAND

# docker-bake.json grows with the matrix (~1.2 KiB per flavour): read and written up to a bound that holds the
# largest matrix validation accepts (model.matrix.MAX_FLAVOURS) at 4 KiB a flavour. Every other generated file is
# one flavour's or a fixed workflow's, within userfiles.GENERATED_LIMIT.
BAKE_LIMIT = 8 * 1024 * 1024
# Committed once, not rendered: the wheel-build script and its builder image. `lint` checks them too.
WHEEL_BUILD_STATIC = (WHEEL_BUILD_SCRIPT, f"{WHEEL_BUILDS_DIR}/Dockerfile")


@dataclass(frozen=True)
class Finding:
    """One difference between the disk and what `render` / `lock` would write."""

    kind: str  # "missing" | "stale" | "orphan" | "unlocked"
    path: str  # relative to the repository root
    message: str
    # Warnings are reported but do not fail `render --check` (e.g. a lock that cannot be made on this site).
    warning: bool = False

    def __str__(self) -> str:
        level = "warning" if self.warning else "drift"
        return f"{self.path}: {level} [{self.kind}]: {self.message}"


@dataclass(frozen=True)
class WriteResult:
    written: tuple[str, ...]
    unchanged: int
    removed: tuple[str, ...]
    kept_orphans: tuple[str, ...]


# --- the set of generated files ---------------------------------------------------------------------------

def expected_files(plan: Plan) -> dict[Path, str]:
    """Every file `render` owns, by path relative to the repository root: flavour, wheel-build and CI files,
    the JSON Schemas of matrix.yaml and site.yaml, and (in a checkout with docs/) the rules page."""
    files: dict[Path, str] = {}
    for flavour in plan.flavours:
        directory = plan.flavour_dir(flavour).relative_to(plan.root)
        for name, text in plan.rendered[flavour.tag].items():
            files[directory / name] = text
    files.update({Path(path): text for path, text in render.render_wheel_builds(plan.flavours).items()})
    files.update(cigen.generated_files(plan))
    files.update(schemas.generated_files())
    files.update(rulesdoc.generated_files(plan.root))
    return files


def lint_targets(plan: Plan) -> dict[str, str]:
    """What `lint` checks: the rendered Dockerfiles and wheel-build parameters, and the committed wheel-build
    script and builder Dockerfile (read from the repository; absent outside a checkout)."""
    files = {str(path): text for path, text in expected_files(plan).items()
             if path.name in render.TEMPLATES or str(path).startswith(f"{WHEEL_BUILDS_DIR}/")}
    for relative in WHEEL_BUILD_STATIC:
        text = userfiles.read_optional(plan.root / relative)
        if text is not None:
            files[relative] = text
    return files


# --- writing ----------------------------------------------------------------------------------------------

def write_if_changed(path: Path, text: str, root: Path | None = None) -> bool:
    """Write `text` to `path` unless it holds exactly that already; True when it wrote. With `root` (the
    repository), the path is checked first to lie inside it through no link (diskio.inside).

    The new file gets the umask's mode like any checkout file (builders and other users read the generated
    files). Whatever stands at `path` that is not a bounded UTF-8 file (a fifo, a sparse giant, Latin-1 text) is
    simply replaced; a symlink or a directory there is an error naming it (diskio.inside).
    """
    if root is not None:
        diskio.inside(root, path)
    if _read(path) == text:
        return False
    diskio.write_text_atomic(path, text, "a generated file", root=root, shared=True)
    return True


def write_files(root: Path, files: dict[Path, str]) -> list[Path]:
    """Write the files (relative to `root`) that differ from the disk; return those written.

    None is written when one is larger than `render --check` reads (check_sizes).
    """
    check_sizes(files)
    return [relative for relative, text in files.items() if write_if_changed(root / relative, text, root)]


def size_limit(path: Path) -> int:
    """The most bytes a generated file at `path` may hold: what `render` writes and `render --check` reads."""
    return BAKE_LIMIT if path.name == cigen.BAKE_FILE.name else userfiles.GENERATED_LIMIT


def check_sizes(files: dict[Path, str]) -> None:
    """Refuse (rule `render-size`) a generated file larger than its size_limit, before anything is written:
    `render --check` reads at most that, so a larger one would be written once and then refused by its own
    check. One limit, here and there."""
    for relative, text in files.items():
        size, limit = len(text.encode("utf-8")), size_limit(Path(relative))
        if size > limit:
            raise ConfigError(f"would be {size / 1024 / 1024:.1f} MiB, more than the {limit / 1024 / 1024:g} MiB "
                              "a generated file may be (what `render --check` reads)", location=str(relative),
                              rule="render-size", hint="the matrix declares more flavours than one generated file "
                                                       "holds: exclude some, or keep several matrices")


def write(plan: Plan) -> WriteResult:
    """Write every rendered file that differs from the disk; remove orphan flavour directories and wheel builds.

    An orphan directory (a flavour no longer in the matrix) is removed only when every file in it is one we
    generated; anything else in it is left alone and reported, so render never deletes a user's work.
    """
    files = expected_files(plan)
    for relative in files:  # refuse a symlinked or misshapen folder before anything is written
        diskio.inside(plan.root, relative)
    written = write_files(plan.root, files)
    removed, kept = [], []
    for directory in _orphan_dirs(plan):
        relative = str(directory.relative_to(plan.root))
        if _holds_only_generated(directory):
            diskio.remove_tree(plan.root, directory)
            removed.append(relative)
        else:
            kept.append(relative)
    for path in _orphan_wheel_builds(plan):
        if _is_generated(path):
            diskio.remove_file(plan.root, path)
            removed.append(str(path.relative_to(plan.root)))
    return WriteResult(tuple(str(path) for path in written), len(files) - len(written), tuple(removed), tuple(kept))


# --- the drift check --------------------------------------------------------------------------------------

def drift(root: Path, files: dict[Path, str]) -> list[Finding]:
    """`files` (relative to `root`) that are missing on disk or differ from what is there."""
    check_sizes(files)  # what `render` would refuse to write is an error here too, not "stale" forever
    findings = []
    for relative, text in files.items():
        diskio.inside(root, relative)  # a symlinked or misshapen folder on the way is an error naming it
        try:
            on_disk = userfiles.read_optional(root / relative, limit=size_limit(Path(relative)))
        except ConfigError as error:
            findings.append(Finding("stale", str(relative), f"{error.message}; run `{RENDER_COMMAND}`"))
            continue
        if on_disk is None:
            findings.append(Finding("missing", str(relative), f"not rendered; run `{RENDER_COMMAND}`"))
        elif on_disk != text:
            findings.append(Finding("stale", str(relative),
                                    f"differs from what its template renders; run `{RENDER_COMMAND}`"))
    return findings


def check(plan: Plan) -> list[Finding]:
    """What differs between the disk and what `render` (and `lock`) would write. No network, no writes."""
    findings = drift(plan.root, expected_files(plan))
    findings.extend(_orphans(plan))
    findings.extend(_lock_findings(plan))
    return findings


def _orphans(plan: Plan) -> list[Finding]:
    findings = [Finding("orphan", str(directory.relative_to(plan.root)), _orphan_dir_message(directory))
                for directory in _orphan_dirs(plan)]
    owned = set(render.TEMPLATES) | {LOCK_NAME, CONSTRAINTS_NAME}
    for flavour in plan.flavours:
        directory = plan.flavour_dir(flavour)
        if _is_real_dir(directory):
            for path in sorted(directory.iterdir()):
                if path.name not in owned:
                    findings.append(Finding("orphan", str(path.relative_to(plan.root)),
                                            "not a file xla-images generates; delete it"))
    for path in _orphan_wheel_builds(plan):
        why = (f"no flavour of the matrix uses this wheel build; run `{RENDER_COMMAND}` to remove it"
               if _is_generated(path) else "not a file xla-images generates; delete it")
        findings.append(Finding("orphan", str(path.relative_to(plan.root)), why))
    return findings


def _orphan_dir_message(directory: Path) -> str:
    """What to do about an entry of Dockerfiles/ no flavour owns: only `render` removes what it generated."""
    if _holds_only_generated(directory):
        return f"no flavour of the matrix has this tag; run `{RENDER_COMMAND}` to remove it"
    if _is_real_dir(directory):
        return "no flavour of the matrix has this tag, and it holds files xla-images did not generate; delete it"
    return "not a folder xla-images generates; delete it"


def _orphan_wheel_builds(plan: Plan) -> list[Path]:
    """Files in wheel-builds/ that are neither the committed script and builder nor a current parameter file."""
    folder = plan.root / WHEEL_BUILDS_DIR
    if not _is_real_dir(folder):
        return []
    known = set(WHEEL_BUILD_STATIC) | set(render.render_wheel_builds(plan.flavours))
    return [path for path in sorted(folder.iterdir())
            if not _is_real_dir(path) and str(path.relative_to(plan.root)) not in known]


def _orphan_dirs(plan: Plan) -> list[Path]:
    """Entries of Dockerfiles/ no flavour owns: folders, and links or files (never generated, so never removed)."""
    parent = plan.root / DOCKERFILES
    if not _is_real_dir(parent):
        return []
    tags = {flavour.tag for flavour in plan.flavours}
    return [path for path in sorted(parent.iterdir()) if path.name not in tags]


def _is_real_dir(path: Path) -> bool:
    """A directory, not a link to one (lstat)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _holds_only_generated(directory: Path) -> bool:
    """A real folder whose every entry, all the way down, is a real folder or a generated regular file."""
    if not _is_real_dir(directory):
        return False
    for folder, subfolders, names in os.walk(directory):  # os.walk follows no links by default
        for name in subfolders:
            if not _is_real_dir(Path(folder) / name):
                return False
        if not all(_is_generated(Path(folder) / name) for name in names):
            return False
    return True


def _is_generated(path: Path) -> bool:
    """A regular file (no link) whose first three lines carry GENERATED_MARK."""
    try:
        text = userfiles.read_optional(path)
    except ConfigError:
        return False
    return text is not None and any(GENERATED_MARK in line for line in text.splitlines()[:3])


def _read(path: Path) -> str | None:
    """The text at `path`, or None when it is absent or not a bounded UTF-8 regular file (render replaces it)."""
    try:
        return userfiles.read_optional(path, limit=size_limit(path))
    except ConfigError:
        return None


# --- locks ------------------------------------------------------------------------------------------------

def _lock_findings(plan: Plan) -> list[Finding]:
    findings = []
    for flavour in plan.flavours:
        status = lockfile.lock_status(plan, flavour)
        relative = str(plan.lock_path(flavour).relative_to(plan.root))
        command = f"./build.py lock {flavour.tag}"
        if status.state is lockfile.LockState.MISSING:
            findings.append(Finding("missing", relative, f"no lock; run `{command}`"))
        elif status.state is lockfile.LockState.STALE:
            findings.append(Finding("stale", relative, f"{status.detail}; run `{command}`"))
        elif status.state is lockfile.LockState.UNAVAILABLE:
            findings.append(Finding("unlocked", relative, status.detail, warning=True))
    return findings
