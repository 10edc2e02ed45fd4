"""run.building.groups: images that share layers are built one after another, oldest release first."""
from __future__ import annotations

from golden import fixed_flavour_list
from xla_images.run.building import groups

EVERY_IMAGE = [image for flavour in fixed_flavour_list() for image in (flavour, flavour.devel)]


def test_each_cache_group_is_built_in_one_stretch_with_each_devel_image_right_after_its_runtime() -> None:
    ordered = groups.build_order(reversed(EVERY_IMAGE))
    stretches = [groups.cache_group(flavour) for flavour in ordered]
    seen: list[tuple[str, str]] = []
    for group in stretches:
        if not seen or seen[-1] != group:
            assert group not in seen, f"{group} built in two stretches"
            seen.append(group)
    for before, after in zip(ordered, ordered[1:]):
        if after.is_devel:
            assert before.tag == after.runtime_tag


def test_releases_come_oldest_first() -> None:
    versions = [flavour.torch_xla for flavour in groups.build_order(EVERY_IMAGE)]
    assert versions == sorted(versions, key=lambda text: tuple(int(part) for part in text.split(".")))


