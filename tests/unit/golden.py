"""Golden files (tests/golden/) and the fixed matrix the rendering tests use: shared by test_render.py,
test_build_wheels_script.py and test_committed_matrix.py."""
from __future__ import annotations

import functools
import os
from pathlib import Path

from xla_images import yamlsrc
from xla_images.model import matrix
from xla_images.model.flavour import Flavour
from xla_images.model.site import load_site
from xla_images.model.target import bind

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# A matrix of our own, so the golden files change when the templates or the flavour logic change, not when
# matrix.yaml gains a release.
FIXED_MATRIX = """\
schema: 1
defaults:
  pythons: ["3.10", "3.11", "3.12"]
  accelerators: [tpu, cpu]
  default_abi: cxx11
  abis: [cxx11]
  latest_python: "3.11"
releases:
  "2.6.0":
    torch: "2.6.0"
    pytorch_git_rev: v2.6.0
    xla_git_rev: v2.6.0
    python_support: ">=3.9,<3.12"
    default_abi: pre-cxx11
    abis: [pre-cxx11, cxx11]
    libtpu: "0.0.7.1"
  "2.9.0":
    torch: "2.9.0"
    pytorch_git_rev: v2.9.1
    xla_git_rev: v2.9.0
    python_support: ">=3.10,<3.14"
    libtpu: "0.0.21"
"""


def update_golden() -> bool:
    """XLA_IMAGES_UPDATE_GOLDEN=1 rewrites the golden files (then review the diff like code)."""
    return os.environ.get("XLA_IMAGES_UPDATE_GOLDEN") == "1"


def flavours_for(overrides: tuple[str, ...] = ()) -> list[Flavour]:
    site = load_site(None, overrides, root=Path("/nonexistent-site-root"))
    return bind(matrix.expand(yamlsrc.loads(FIXED_MATRIX, "fixed-matrix.yaml")), site)


@functools.lru_cache(maxsize=None)
def fixed_flavour_list() -> tuple[Flavour, ...]:
    """Every flavour of the fixed matrix, in the matrix's order (made once)."""
    return tuple(flavours_for())


def fixed_flavours() -> dict[str, Flavour]:
    return {flavour.tag: flavour for flavour in fixed_flavour_list()}
