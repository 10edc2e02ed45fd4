"""Find the shared objects of a tree, and say clearly why a path given on the command line is not there.

The walk is iterative and follows each inode once: a deep tree, symlink loops and cycles cannot make it recurse or
repeat, and a directory or library that cannot be read is a usage error, never silently skipped. A directory link
is followed only when it resolves inside the tree the walk was given: `pkg/rootlink -> /` would otherwise make a
verdict on one site-packages walk the whole file system (issue 35). Such links are listed (`WalkNotes.outside`)
so a report can say what it did not read.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from .elf import has_elf_magic, unreadable_path
from .words import RULE_PATH, usage_error

SHARED_OBJECT_NAME = re.compile(r"\.so(?:\.[0-9]+)*$")


def missing_path_error(path: Path, hint: str) -> ConfigError:
    """'does not exist', saying why when path is a symlink: a loop, or pointing nowhere."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:
            return usage_error(f"{path} does not exist: it is a symlink loop", hint=hint, rule=RULE_PATH)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return usage_error(f"{path} does not exist: it is a symlink loop", hint=hint, rule=RULE_PATH)
        return usage_error(f"{path} does not exist: it is a dangling symlink to {os.readlink(path)}", hint=hint,
                            rule=RULE_PATH)
    return usage_error(f"{path} does not exist", hint=hint, rule=RULE_PATH)


def is_path_target(target: str) -> bool:
    """Is the CLI argument a path (one report: a JSON object) rather than an image (a JSON array)?

    Existing paths, and things that can only be meant as paths, so a typo is reported, not looked up as an image.
    """
    return os.path.exists(target) or target.endswith((".whl", ".so")) or target.startswith(("/", ".", "~"))


@dataclass
class WalkNotes:
    """What a walk left out on purpose: directory links resolving outside its tree ("pkg/rootlink -> /")."""

    outside: list[str] = field(default_factory=list)


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def walk_shared_objects(root: Path, notes: WalkNotes | None = None,
                        also_inside: tuple[Path, ...] = ()) -> Iterator[tuple[str, Path]]:
    """(path relative to root, path) of each ELF shared object under root, following symlinks once, and directory
    links only while they stay inside root or one of also_inside (a tree the caller vouches for, such as the
    image's own /opt/xla-images that site-packages links into); those that leave are added to notes.outside.

    Iterative (os.walk recurses once per level in python 3.11: a deep tree would end in RecursionError), and a
    directory or library that cannot be read is a usage error: skipping it would give a verdict on part of
    the tree. Symlinks that loop or point nowhere are what the loader would not find either: skipped."""
    # Files and directories are known by (device, inode) after following symlinks: os.path.realpath costs one
    # lstat per path component, quadratic in a deep tree.
    seen: set[tuple[int, int]] = set()
    inside_reals = [os.path.realpath(root), *(os.path.realpath(tree) for tree in also_inside)]
    pending = [(str(root), "")]
    while pending:
        directory, relative = pending.pop()
        try:
            identity = os.stat(directory)
        except OSError:
            continue  # vanished, or a symlink loop: nothing the loader would find there either
        if (identity.st_dev, identity.st_ino) in seen:
            continue
        seen.add((identity.st_dev, identity.st_ino))
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            raise unreadable_path(directory, error) from None
        subdirectories = []
        for entry in entries:
            inside = f"{relative}{entry.name}"
            if _is_directory(entry):
                if entry.is_symlink() and not any(_inside(os.path.realpath(entry.path), tree) for tree in inside_reals):
                    if notes is not None:
                        notes.outside.append(f"{inside} -> {os.readlink(entry.path)}")
                    continue
                subdirectories.append((entry.path, inside + "/"))
                continue
            if not SHARED_OBJECT_NAME.search(entry.name):
                continue
            try:
                target = entry.stat()  # follows symlinks
            except OSError:
                continue  # a dangling symlink or a loop
            if not stat.S_ISREG(target.st_mode) or (target.st_dev, target.st_ino) in seen:
                continue
            if not has_elf_magic(Path(entry.path)):
                continue
            seen.add((target.st_dev, target.st_ino))
            yield inside, Path(entry.path)
        pending.extend(reversed(subdirectories))  # depth first, in name order


def _is_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks; False for loops and dangling ones
    except OSError:
        return False
