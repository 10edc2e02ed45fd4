"""How a run is split across engines (whole cache groups, run.building.groups), and what sets an image aside."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ...model.target import Target
from ..building.groups import build_order, cache_group


@dataclass(frozen=True)
class Blocked:
    """An image this machine cannot build at all, why, and what would make it buildable."""

    flavour: Target
    reason: str
    fix: str


def shard(flavours: Iterable[Target], engines: int) -> list[list[Target]]:
    """Split a run across `engines`: whole cache groups to one engine (what shares layers is built where they
    are), the largest group first to the engine with the least work so far. Each share keeps the build order."""
    if engines < 1:
        raise ValueError("at least one engine")
    groups: dict[tuple[str, str], list[Target]] = {}
    for flavour in build_order(flavours):
        groups.setdefault(cache_group(flavour), []).append(flavour)
    shares: list[list[Target]] = [[] for _ in range(engines)]
    for group in sorted(groups.values(), key=len, reverse=True):
        lightest = min(range(engines), key=lambda index: (len(shares[index]), index))
        shares[lightest].extend(group)
    return [build_order(share) for share in shares]
