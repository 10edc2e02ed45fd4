"""Golden files (tests/golden/) and the fixed matrix the rendering tests use: shared by test_render.py,
test_build_wheels_script.py and test_committed_matrix.py.

Run as a script, `python tests/unit/golden.py committed-matrix` rewrites the golden summary of the committed
matrix (tests/golden/committed-matrix.json): the scheduled update workflow does after `update --write`, with
only xla-images installed (no pytest, no test extra), so the pull request it opens carries its golden file.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from xla_images import yamlsrc
from xla_images.generate import cigen
from xla_images.generate.plan import load_plan
from xla_images.model import matrix
from xla_images.model.flavour import Flavour
from xla_images.model.site import load_site
from xla_images.model.target import bind

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
COMMITTED_MATRIX_GOLDEN = GOLDEN / "committed-matrix.json"

# A matrix of our own (tests/fixtures/matrix/two-releases.yaml: 2.6.0 in both ABIs, 2.9.0), so the golden files
# change when the templates or the flavour logic change, not when matrix.yaml gains a release.
FIXED_MATRIX = (Path(__file__).resolve().parents[1] / "fixtures" / "matrix" / "two-releases.yaml").read_text(
    encoding="utf-8")


def two_releases(*edits: tuple[str, str]) -> str:
    """The fixed matrix with exact text edits (old, new): a test's own matrix, said as its difference from the one
    every test shares, so no test pastes a copy of it."""
    text = FIXED_MATRIX
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


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


def committed_matrix_summary() -> str:
    """What the committed matrix declares, one line per flavour: what a matrix change shows in review."""
    plan = load_plan(ROOT / "matrix.yaml")
    flavours = {
        flavour.tag: {
            "aliases": list(flavour.aliases),
            "requirements": list(flavour.requirements),
            "abi": flavour.abi.value,
            "PJRT_DEVICE": flavour.env["PJRT_DEVICE"],
            "wheel_source": flavour.wheel_source.name,
            "git_revs": [flavour.pytorch_git_rev, flavour.xla_git_rev],
            # What `update` learned: the torchvision/torchaudio every image's constraints pin.
            "companions": dict(flavour.companion_versions),
        }
        for flavour in plan.flavours
    }
    groups = {name: len(group["targets"]) for name, group in cigen.bake_config(plan)["group"].items()}
    lines = ["{", f' "count": {len(flavours)},', f' "bake_group_sizes": {json.dumps(groups)},', ' "flavours": {']
    lines += [f"  {json.dumps(tag)}: {json.dumps(facts)}," for tag, facts in flavours.items()]
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines + [" }", "}"]) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["committed-matrix"]:
        sys.exit("usage: python tests/unit/golden.py committed-matrix")
    COMMITTED_MATRIX_GOLDEN.write_text(committed_matrix_summary(), encoding="utf-8")
    print(f"wrote {COMMITTED_MATRIX_GOLDEN.relative_to(ROOT)}")
