"""Every file-system shape at every path the generated-file commands read or write (issue 19), enumerated.

The table is the cross product of fs_shapes.SHAPES (regular oddities, empty, 3 GiB sparse, fifo, directory,
links inside / outside / loop / dangling, /dev/zero, unreadable, Latin-1, binary) and fs_shapes.PLACES (a
Dockerfile, a lock, a flavour folder, Dockerfiles/ itself, a wheel-build .env, docker-bake.json, a workflow,
orphans, the old `Dockerfile.tmp` name, site.yaml). Each case runs `render`, `render --check`, `ci github
--check`, `ci bake --check` and `list --json` through the real CLI in this process, and holds them to:

* an answer: exit 0, 1 (drift named) or 2 (`file:line: error [rule]`), never a traceback, within seconds
  (run_cli's alarm fails a case that hangs);
* nothing outside the checkout written or removed (`outside`, where links point, is byte-identical);
* no temporary file left;
* after a `render` that succeeded, `render --check` finds no drift of what render writes (the lock is not
  render's, so a planted lock stays reported; an orphan that is not render's is kept and reported), and every
  planted thing that is not where render writes is still there: render removes nothing it did not generate.

Deterministic: a fixed table, no randomness (benchmarks/bench_hostile.py --random draws random combinations).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fs_shapes import PLACES, SHAPES, Checkout, copy_checkout, leftovers, plant, snapshot, unplant
from hostile_inputs import Outcome, assert_answered, run_cli

# Exit-1 answers: drift found, or (ci bake) a flavour whose lock the shape took away.
DRIFT = frozenset({"render-drift", "ci-drift", "lock-exists"})
# `render --check` then `render` everywhere; the CI checks and `list` where they read what the place holds.
EVERYWHERE = (("render", "--check"), ("render",))
CI_CHECKS = (("ci", "github", "--check"), ("ci", "bake", "--check"))
LIST = (("list", "--json"),)
FOLDERS = {"flavour-folder", "dockerfiles-folder", "lock", "site"}
COMMANDS = {place: (CI_CHECKS if place in FOLDERS | {"bake-file", "workflow"} else ())
            + (LIST if place in FOLDERS else ()) + EVERYWHERE for place in PLACES}
# Where render itself replaces what it finds (a generated file of the wrong content or kind) vs. where a shape is
# an error it names: a link or a directory where it writes, a file where its folder belongs.
RENDERED = {"dockerfile", "wheel-build-env", "bake-file", "workflow", "flavour-folder", "dockerfiles-folder"}
REFUSED_ON_RENDER = {"link-inside", "link-outside-file", "link-outside-folder", "link-loop",
                     "link-dangling", "dev-zero"}


@pytest.fixture
def checkout(pristine: Checkout, tmp_path: Path) -> Checkout:
    """A fresh copy of the module's pristine checkout (tests/unit/conftest.py)."""
    return copy_checkout(pristine, tmp_path)


def run(checkout: Checkout, *args: str) -> Outcome:
    return run_cli(*args, "--matrix", str(checkout.matrix))  # a hang fails by run_cli's alarm


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_shape_at_every_place_is_answered_and_stays_inside(checkout: Checkout, place: str,
                                                                  shape: str) -> None:
    planted = plant(checkout, place, shape)
    outside_before = snapshot(checkout.outside)
    try:
        for command in COMMANDS[place]:
            outcome = run(checkout, *command)
            assert_answered(outcome, allowed_failures=DRIFT)
            assert snapshot(checkout.outside) == outside_before, f"{command} changed what lies outside the checkout"
            assert not leftovers(checkout.root, planted), f"{command} left temporary files"
            if command == ("render",) and outcome.code == 0:
                after = run(checkout, "render", "--check")
                drifted = [line for line in after.err.splitlines() if ": drift [" in line
                           and "requirements.lock" not in line and "drift [orphan]" not in line]
                assert not drifted, after.err
                if place not in RENDERED:
                    assert os.path.lexists(planted), f"render removed {planted}, which it did not generate"
    finally:
        unplant(planted)


@pytest.mark.parametrize("shape", sorted(REFUSED_ON_RENDER))
@pytest.mark.parametrize("place", ["dockerfile", "flavour-folder", "dockerfiles-folder", "bake-file"])
def test_render_refuses_a_link_or_a_folder_where_it_writes_and_names_it(checkout: Checkout, place: str,
                                                                          shape: str) -> None:
    planted = plant(checkout, place, shape)
    outcome = run(checkout, "render")
    assert outcome.code == 2, outcome.err
    assert any(rule.startswith("disk-") for rule in outcome.rules), outcome.err
    assert str(planted) in outcome.err


def test_a_symlinked_dockerfiles_folder_writes_and_removes_nothing_where_it_points(checkout: Checkout) -> None:
    """The reported case: `Dockerfiles` a link to another folder holding an empty folder and a generated one."""
    import shutil
    shutil.rmtree(checkout.root / "Dockerfiles")
    (checkout.root / "Dockerfiles").symlink_to(checkout.outside)
    before = snapshot(checkout.outside)
    outcome = run(checkout, "render")
    assert outcome.code == 2 and outcome.rules == ["disk-symlink"], outcome.err
    assert snapshot(checkout.outside) == before
    assert (checkout.outside / "empty-folder").is_dir() and (checkout.outside / "generated-folder").is_dir()


def test_a_planted_temp_name_link_is_not_written_through(checkout: Checkout) -> None:
    """The old writer wrote `Dockerfile.tmp` then renamed it: a link planted there made render overwrite its
    target. The writer's temporary names are unique and created exclusively, never through a link."""
    dockerfile = checkout.root / PLACES["dockerfile"]
    dockerfile.write_text("stale\n")
    plant(checkout, "old-temp-name", "link-outside-file")
    before = snapshot(checkout.outside)
    outcome = run(checkout, "render")
    assert outcome.code == 0, outcome.err
    assert snapshot(checkout.outside) == before
    assert dockerfile.read_text().startswith("# Generated by xla-images")


def test_an_orphan_folder_that_is_a_link_is_reported_and_kept(checkout: Checkout) -> None:
    link = plant(checkout, "orphan-folder", "link-outside-folder")
    outcome = run(checkout, "render")
    assert outcome.code == 0, outcome.err
    assert f"kept {link.relative_to(checkout.root)}" in outcome.err
    assert link.is_symlink() and (checkout.outside / "generated-folder" / "Dockerfile").is_file()
