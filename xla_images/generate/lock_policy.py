"""Which inputs a flavour's requirements.lock may be resolved from: the one policy `lock` follows when it resolves
(run.packages.lock) and `render --check` follows when it judges a committed lock fresh (generate.sync).

A release family (one torch_xla, ABI and wheel source) is locked python by python, the lowest (the anchor) first.
A flavour is resolved together with the flavours that differ from it only by accelerator (its group), and, off the
anchor python, with the anchor's python-independent pins too (`aligned_pins`), so its `torch-any` layer holds the
same wheels byte for byte (see layers.py). Each way of resolving is an `Attempt`, tried in order:

  with pins:    the group + the pins; the group alone (recorded as `unaligned`); the flavour alone (`unaligned`)
  without pins: the group; the flavour alone

and a lock is fresh when its recorded inputs are those of one of its attempts.
"""
from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from ..errors import XlaImagesError
from ..model import lockfile
from ..model.target import Target
from .plan import Plan


@dataclass(frozen=True)
class Attempt:
    """One way to resolve a lock: pip is asked for `roots`; the lock records `recorded` as what it came from."""

    roots: tuple[str, ...]
    recorded: tuple[str, ...]
    together: bool  # with the flavour's group (False: the flavour alone)


def attempts(plan: Plan, flavour: Target) -> list[Attempt]:
    """The ways `flavour`'s lock may be resolved, in the order `lock` tries them."""
    group = lockfile.group_requirements(plan.flavours, flavour)
    alone = flavour.requirements
    pins = aligned_pins(plan, flavour)
    if not pins:
        return [Attempt(group, group, True), Attempt(alone, alone, False)]
    unaligned = (lockfile.unaligned(pins),)
    return [Attempt(group + pins, group + pins, True), Attempt(group, group + unaligned, True),
            Attempt(alone, alone + unaligned, False)]


def accepted_inputs(plan: Plan, flavour: Target) -> set[str]:
    """The `# inputs:` hashes a fresh lock of `flavour` may carry."""
    return {lockfile.lock_inputs(flavour, attempt.recorded) for attempt in attempts(plan, flavour)}


def aligned_pins(plan: Plan, flavour: Target) -> tuple[str, ...]:
    """`name==version` of every python-independent wheel locked for the anchor python of `flavour`'s release.

    Empty for the anchor python itself and while its locks are missing or unreadable.
    """
    anchor = lockfile.anchor_python(plan.flavours, flavour)
    if flavour.python == anchor:
        return ()
    family = [other for other in plan.flavours if lockfile.release_family(other) == lockfile.release_family(flavour)]
    # The requirement roots (torch, torch_xla, libtpu) are pinned by each flavour itself, some only in some.
    roots = {canonicalize_name(lockfile.parse_requirement(text).name) for other in family for text in other.requirements}
    pins: set[str] = set()
    for other in family:
        if other.python != anchor:
            continue
        try:
            lock = lockfile.read_lock(plan.lock_path(other))
        except XlaImagesError:
            continue
        pins.update(f"{entry.name}=={entry.version}" for entry in lock.entries
                    if lockfile.is_pure_wheel(entry.filename) and entry.name not in roots)
    return tuple(sorted(pins))
