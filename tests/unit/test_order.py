"""run.pipeline.order: a split across engines keeps each cache group on one engine."""
from __future__ import annotations

from hypothesis import given, strategies as st

from golden import fixed_flavour_list
from xla_images.run.building.groups import build_order, cache_group
from xla_images.run.pipeline import order

EVERY_IMAGE = [image for flavour in fixed_flavour_list() for image in (flavour, flavour.devel)]


@given(st.integers(min_value=1, max_value=6), st.permutations(EVERY_IMAGE))
def test_a_split_gives_every_image_to_exactly_one_engine_whole_groups_each(engines: int, images: list) -> None:
    shares = order.shard(images, engines)
    assert len(shares) == engines
    tags = [flavour.tag for share in shares for flavour in share]
    assert sorted(tags) == sorted(flavour.tag for flavour in images)
    owner = {}
    for index, share in enumerate(shares):
        assert share == build_order(share)
        for flavour in share:
            assert owner.setdefault(cache_group(flavour), index) == index
    sizes = sorted(len(share) for share in shares)
    biggest_group = max(sum(1 for f in images if cache_group(f) == g) for g in owner)
    assert sizes[-1] - sizes[0] <= biggest_group  # greedy by size: no engine idles while another has two groups more
