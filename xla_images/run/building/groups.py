"""Which images share layers, and the order that builds them one after another.

Images that share layers are built one after another, so the build cache still holds what the previous one
made: a release's flavours of one python (the wheels, the python-independent layers), a cpu/tpuvm pair, and a
runtime image with its devel image (a stage of the same Dockerfile). Between two such groups nothing is shared
but the base, which is where a run frees the build cache (`cache_group`): `build --prune-cache` given several
images, and the pipeline (run.pipeline) after each group.
"""
from __future__ import annotations

from typing import Iterable

from packaging.version import InvalidVersion, Version

from ...model.target import Target


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
