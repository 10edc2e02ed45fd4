"""Which byte strings occur in an image's `docker save` stream (its layers are uncompressed tars): how the
engine tests look for a planted CA or wheel in every layer (test_build.py, test_layers_reproducible.py)."""
from __future__ import annotations

from typing import Iterable


def scan(chunks: Iterable[bytes], needles: list[bytes]) -> dict[bytes, bool]:
    """Which needles occur anywhere in a stream (`docker save`: layers are uncompressed tars)."""
    found = {needle: False for needle in needles}
    overlap = max(len(needle) for needle in needles) - 1
    tail = b""
    for chunk in chunks:
        window = tail + chunk
        for needle in needles:
            found[needle] = found[needle] or needle in window
        tail = window[-overlap:]
    return found
