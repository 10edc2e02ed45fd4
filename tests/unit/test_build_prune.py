"""`build --prune-cache` given several images drops the build cache once per cache group (a release on one
python), after the group's last image, not after every image: the next image of the group reuses the cache.

The engine's answers are stand-ins here; the prune itself runs against the engine in tests/engine/test_build.py."""
from __future__ import annotations

import types

import pytest

from golden import fixed_flavour_list
from xla_images.errors import Failure
from xla_images.run import engine
from xla_images.run.building import build
from xla_images.run.building.groups import build_order, cache_group

SILENT = types.SimpleNamespace(state=lambda *args: None, finished=lambda *args: None, notice=lambda *args: None)


def _build_all(monkeypatch: pytest.MonkeyPatch, tmp_path, flavours, failing: set[str] = frozenset()) -> list[str]:
    """Build `flavours` one after another with stand-in builds; the log of events, prunes included."""
    events: list[str] = []

    def build_and_tag(flavour, result, say) -> str:
        events.append(flavour.tag)
        if flavour.tag in failing:
            raise Failure("stand-in failure", rule="build")
        return "sha256:" + "a" * 64

    def prune() -> int:
        events.append("prune")
        return 0

    monkeypatch.setattr(build._Run, "_build_and_tag",
                        lambda self, flavour, result, say: build_and_tag(flavour, result, say))
    monkeypatch.setattr(build, "_image_size", lambda image_id: 1)
    monkeypatch.setattr(engine.builds, "prune_build_cache", prune)
    run = build._Run(None, build.BuildOptions(prune_cache=True, keep_going=True, reports_dir=tmp_path), SILENT)
    for flavour in flavours:
        run.results[flavour.tag] = build.FlavourResult(flavour)
        run._expect(flavour)
    for flavour in flavours:
        run._build_one(flavour)
    return events


def _two_groups():
    ordered = build_order(image for flavour in fixed_flavour_list() for image in (flavour, flavour.devel))
    first = [flavour for flavour in ordered if cache_group(flavour) == cache_group(ordered[0])]
    second = [flavour for flavour in ordered if cache_group(flavour) == cache_group(ordered[len(first)])]
    assert len(first) >= 2 and len(second) >= 2
    return first, second


def test_the_cache_is_pruned_once_per_group_after_its_last_image(monkeypatch, tmp_path) -> None:
    first, second = _two_groups()
    events = _build_all(monkeypatch, tmp_path, first + second)
    assert events == [flavour.tag for flavour in first] + ["prune"] + [flavour.tag for flavour in second] + ["prune"]


def test_a_group_whose_last_image_failed_still_frees_the_cache(monkeypatch, tmp_path) -> None:
    first, _ = _two_groups()
    events = _build_all(monkeypatch, tmp_path, first, failing={first[-1].tag})
    assert events == [flavour.tag for flavour in first] + ["prune"]
