"""run.pipeline.order: images that share layers are built one after another, and a split keeps them together."""
from __future__ import annotations

from hypothesis import given, strategies as st

from golden import fixed_flavour_list
from xla_images.run.pipeline import order

EVERY_IMAGE = [image for flavour in fixed_flavour_list() for image in (flavour, flavour.devel)]


def test_each_cache_group_is_built_in_one_stretch_with_each_devel_image_right_after_its_runtime() -> None:
    ordered = order.build_order(reversed(EVERY_IMAGE))
    groups = [order.cache_group(flavour) for flavour in ordered]
    seen: list[tuple[str, str]] = []
    for group in groups:
        if not seen or seen[-1] != group:
            assert group not in seen, f"{group} built in two stretches"
            seen.append(group)
    for before, after in zip(ordered, ordered[1:]):
        if after.is_devel:
            assert before.tag == after.runtime_tag


def test_releases_come_oldest_first() -> None:
    versions = [flavour.torch_xla for flavour in order.build_order(EVERY_IMAGE)]
    assert versions == sorted(versions, key=lambda text: tuple(int(part) for part in text.split(".")))


@given(st.integers(min_value=1, max_value=6), st.permutations(EVERY_IMAGE))
def test_a_split_gives_every_image_to_exactly_one_engine_whole_groups_each(engines: int, images: list) -> None:
    shares = order.shard(images, engines)
    assert len(shares) == engines
    tags = [flavour.tag for share in shares for flavour in share]
    assert sorted(tags) == sorted(flavour.tag for flavour in images)
    owner = {}
    for index, share in enumerate(shares):
        assert share == order.build_order(share)
        for flavour in share:
            assert owner.setdefault(order.cache_group(flavour), index) == index
    sizes = sorted(len(share) for share in shares)
    biggest_group = max(sum(1 for f in images if order.cache_group(f) == g) for g in owner)
    assert sizes[-1] - sizes[0] <= biggest_group  # greedy by size: no engine idles while another has two groups more
