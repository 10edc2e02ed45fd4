"""The committed matrix's contents, in one golden file: tags, aliases (`latest`), pins, bake groups.

Every other unit test asserts invariants that hold for any matrix (or uses a matrix of its own), so adding or
removing a release changes this one golden file and nothing else: regenerate it with
`python tests/unit/golden.py committed-matrix` (what the scheduled update workflow runs after `update --write`,
so its pull request passes as opened) or `XLA_IMAGES_UPDATE_GOLDEN=1 pytest tests/unit/test_committed_matrix.py`,
and review its diff with the matrix's.
"""
from __future__ import annotations

import json

from golden import COMMITTED_MATRIX_GOLDEN as GOLDEN_FILE
from golden import committed_matrix_summary as summary
from golden import update_golden


def test_committed_matrix_matches_its_golden_file() -> None:
    text = summary()
    if update_golden():
        GOLDEN_FILE.write_text(text)
    assert text == GOLDEN_FILE.read_text(), (
        f"the committed matrix changed: review, then XLA_IMAGES_UPDATE_GOLDEN=1 rewrites {GOLDEN_FILE}")


def test_the_golden_file_is_what_it_says() -> None:
    """The golden summary parses, and its count is the number of flavours it lists (bake builds a runtime and a
    devel image of each)."""
    data = json.loads(GOLDEN_FILE.read_text())
    assert data["count"] == len(data["flavours"]) and data["bake_group_sizes"]["default"] == 2 * data["count"]
    latest = [tag for tag, facts in data["flavours"].items() if "latest" in facts["aliases"]]
    assert len(latest) <= 1
