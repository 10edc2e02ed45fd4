"""A nightly target pinned to one night: its lock names the night, and the target takes its versions from it.

A release with `channel: nightly` asks for any dev build of its version (`2.10.0.dev*`); `lock` resolves the
newest one the site's nightly wheel source holds and writes it into the lock. `pin_from_locks` (called by the
plan, after binding and before rendering) reads the locked torch/torch_xla versions back into the Target,
which then carries the dated tag, labels and env. Refusing an image that is not the night it claims is
run.checking.nightly_check's job (`verify_image`, called by run.shipping.publish before a push; the image
check `test_image.py` asks its `mismatches` too).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .. import userfiles
from ..errors import ConfigError, Location
from ..names import lock_file
from .flavour import AnyFlavour, dev_base
from .lockfile import parse_lock

PACKAGES = {"torch": "torch", "torch_xla": "torch-xla"}  # module -> canonical name in a lock


def pin_from_locks(flavours: Iterable[AnyFlavour], root: Path) -> list[AnyFlavour]:
    """Nightly flavours with a lock get that night's versions; the others are returned as they are."""
    return [pin_from_lock(flavour, lock_file(root, flavour.tag)) if flavour.is_nightly
            else flavour for flavour in flavours]


def pin_from_lock(flavour: AnyFlavour, path: Path) -> AnyFlavour:
    if not path.is_file():
        return flavour  # unpinned: `lock` will choose the night; build refuses it until then (no fresh lock)
    text = userfiles.read_text(path, limit=userfiles.LOCK_LIMIT)  # bounded: a 3 GiB or Latin-1 lock is an error
    entries = parse_lock(text, str(path)).by_name()
    versions = {}
    for module, name in PACKAGES.items():
        entry = entries.get(name)
        where = Location(str(path), _line_of(text, f"{name}=="))
        if entry is None:
            raise ConfigError(f"the lock of nightly {flavour.tag} pins no {module}", location=where,
                              rule="nightly-lock", hint=f"re-lock it: `./build.py lock {flavour.tag}`")
        if dev_base(entry.version) != flavour.nightly_base:
            raise ConfigError(f"{module} {entry.version} is not a dated nightly of {flavour.nightly_base} "
                              f"({flavour.nightly_base}.devYYYYMMDD)", location=where, rule="nightly-lock",
                              hint=f"the nightly wheel source must serve dev builds; re-lock `{flavour.tag}`")
        versions[module] = entry.version
    return flavour.with_nightly(torch=versions["torch"], torch_xla=versions["torch_xla"])


def _line_of(text: str, prefix: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(prefix):
            return number
    return None
