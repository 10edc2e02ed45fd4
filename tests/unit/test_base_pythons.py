"""run.building.base.bootstrappable: which pythons `build.py base` (and `ci/setup.sh --bases all`) bootstraps."""
from __future__ import annotations

from pathlib import Path

from xla_images.generate.plan import load_plan
from xla_images.run.building import base

ROOT = Path(__file__).resolve().parents[2]


def test_every_python_once_in_version_order_and_each_refusal_with_its_reason() -> None:
    buildable, unbuildable = base.bootstrappable(["3.13", "3.9", "3.11", "3.10", "3.11", "3.12", "3.13"])
    assert buildable == ["3.11", "3.13"]
    assert [python for python, _ in unbuildable] == ["3.9", "3.10", "3.12"]
    for python, reason in unbuildable:
        assert reason == base.unbuildable_reason(python)
        assert f"python{python}" in reason and "site.yaml `bases`" in reason


def test_nothing_asked_nothing_bootstrapped() -> None:
    assert base.bootstrappable([]) == ([], [])


def test_the_committed_matrix_needs_both_bases_this_machine_kind_can_have() -> None:
    """`--bases all` on the committed matrix: bookworm's 3.11 and trixie's 3.13, and a line for each other python."""
    plan = load_plan(ROOT / "matrix.yaml")
    pythons = {image.python for image in plan.every_image}
    buildable, unbuildable = base.bootstrappable(pythons)
    assert buildable == sorted(base.RECIPES) == ["3.11", "3.13"]
    assert {python for python, _ in unbuildable} == pythons - set(base.RECIPES)
