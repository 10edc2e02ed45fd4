"""The order a run builds its images in, and how a run is split across engines.

Images that share layers are built one after another, so the build cache still holds what the previous one
made: a release's flavours of one python (the wheels, the python-independent layers), a cpu/tpuvm pair, and a
runtime image with its devel image (a stage of the same Dockerfile). Between two such groups nothing is shared
but the base, which is why the pipeline frees the build cache there (`cache_group`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from packaging.version import InvalidVersion, Version

from ...model.target import Target


@dataclass(frozen=True)
class Blocked:
    """An image this machine cannot build at all, why, and what would make it buildable."""

    flavour: Target
    reason: str
    fix: str


def cache_group(flavour: Target) -> tuple[str, str]:
    """What an image shares layers with: the images of its release on its python."""
    return flavour.torch_xla, flavour.python


def _version(text: str) -> tuple[int, Version | str]:
    try:
        return 0, Version(text)
    except InvalidVersion:  # a nightly's or an odd spelling: after the releases, by text
        return 1, text


def build_order(flavours: Iterable[Target]) -> list[Target]:
    """Release by release (oldest first), python by python, the cpu image before its tpuvm twin, each runtime
    image followed by its devel image."""
    def key(flavour: Target) -> tuple:
        return (_version(flavour.torch_xla), _version(flavour.python), flavour.accelerator.value,
                flavour.abi.value, flavour.runtime_tag, flavour.is_devel)

    return sorted(flavours, key=key)


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
