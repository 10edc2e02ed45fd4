"""Which byte strings occur in the layers of an image's `docker save` stream, read uncompressed whatever the image
store (checks.saved_layers): how the engine tests look for a planted CA or wheel in every layer (test_build.py,
test_layers_reproducible.py)."""
from __future__ import annotations

from typing import Iterable

from xla_images.run.checking import checks


def scan(chunks: Iterable[bytes], needles: list[bytes]) -> dict[bytes, bool]:
    """Which needles occur anywhere in the image's layers (their tars, uncompressed)."""
    found = {needle: False for needle in needles}
    overlap = max(len(needle) for needle in needles) - 1
    for _layer_id, layer in checks.saved_layers(chunks):
        tail = b""
        while chunk := layer.read(1 << 20):
            window = tail + chunk
            for needle in needles:
                found[needle] = found[needle] or needle in window
            tail = window[-overlap:]
    return found
