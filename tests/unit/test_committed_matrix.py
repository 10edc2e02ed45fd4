"""The committed matrix's contents, in one golden file: tags, aliases (`latest`), pins, bake groups.

Every other unit test asserts invariants that hold for any matrix (or uses a matrix of its own), so adding or
removing a release changes this one golden file and nothing else: regenerate it with
`XLA_IMAGES_UPDATE_GOLDEN=1 pytest tests/unit/test_committed_matrix.py` and review its diff with the matrix's.
"""
from __future__ import annotations

import json
from pathlib import Path

from golden import GOLDEN, update_golden

from xla_images.generate import cigen
from xla_images.generate.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FILE = GOLDEN / "committed-matrix.json"


def summary() -> str:
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
        }
        for flavour in plan.flavours
    }
    groups = {name: len(group["targets"]) for name, group in cigen.bake_config(plan)["group"].items()}
    lines = ["{", f' "count": {len(flavours)},', f' "bake_group_sizes": {json.dumps(groups)},', ' "flavours": {']
    lines += [f"  {json.dumps(tag)}: {json.dumps(facts)}," for tag, facts in flavours.items()]
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines + [" }", "}"]) + "\n"


def test_committed_matrix_matches_its_golden_file() -> None:
    text = summary()
    if update_golden():
        GOLDEN_FILE.write_text(text)
    assert text == GOLDEN_FILE.read_text(), (
        f"the committed matrix changed: review, then XLA_IMAGES_UPDATE_GOLDEN=1 rewrites {GOLDEN_FILE}")


def test_the_golden_file_is_what_it_says() -> None:
    """The golden summary parses, and its count is the number of flavours it lists."""
    data = json.loads(GOLDEN_FILE.read_text())
    assert data["count"] == len(data["flavours"]) and data["bake_group_sizes"]["default"] == data["count"]
    latest = [tag for tag, facts in data["flavours"].items() if "latest" in facts["aliases"]]
    assert len(latest) <= 1
