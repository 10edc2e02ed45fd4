"""model/flavour.py's variants: a runtime flavour and its devel image (`<tag>_devel`), and how the plan, the
filters and the ids treat them."""
from __future__ import annotations

from pathlib import Path

import pytest

from golden import fixed_flavours
from xla_images.generate.plan import load_plan
from xla_images.model.flavour import Variant, facts_match
from xla_images.names import DEVEL_STAGE, RUNTIME_STAGE, VARIANT_LABEL

ROOT = Path(__file__).resolve().parents[2]


def test_the_devel_variant_carries_its_own_tag_aliases_labels_and_env() -> None:
    runtime = fixed_flavours()["r2.9.0_3.11_tpuvm"]
    devel = runtime.devel
    assert runtime.variant is Variant.RUNTIME and devel.variant is Variant.DEVEL and devel.is_devel
    assert devel.tag == "r2.9.0_3.11_tpuvm_devel" and devel.runtime_tag == runtime.tag == runtime.runtime_tag
    assert devel.aliases == tuple(f"{alias}_devel" for alias in runtime.aliases) and devel.aliases
    assert devel.variant.stage == DEVEL_STAGE and runtime.variant.stage == RUNTIME_STAGE
    assert devel.labels["io.xla-images.tag"] == devel.tag and devel.labels[VARIANT_LABEL] == "devel"
    assert devel.labels["io.xla-images.runtime-tag"] == runtime.tag and VARIANT_LABEL not in runtime.labels
    assert devel.env["XLA_IMAGES_TAG"] == devel.tag and devel.env["PIP_NO_BUILD_ISOLATION"] == "0"
    # Everything else is the runtime's: the same torch, pins, constraints and ABI.
    assert {key: value for key, value in devel.env.items() if runtime.env.get(key) != value} == {
        "XLA_IMAGES_TAG": devel.tag, "XLA_IMAGES_VARIANT": "devel", "PIP_NO_BUILD_ISOLATION": "0"}
    assert devel.runtime == runtime and devel.devel == devel
    assert devel.wheel_build == runtime.wheel_build and devel.requirements == runtime.requirements


def test_the_plan_lists_each_runtime_flavour_then_its_devel_image_with_its_own_id() -> None:
    plan = load_plan(ROOT / "matrix.yaml")
    images = plan.every_image
    assert [image.tag for image in images[::2]] == [flavour.tag for flavour in plan.flavours]
    assert [image.tag for image in images[1::2]] == [flavour.tag + "_devel" for flavour in plan.flavours]
    ids = [image.id for image in images]
    assert all(ids) and len(set(ids)) == len(ids)
    # The devel id follows its runtime's (which hashes the whole Dockerfile, devel stage included).
    runtime = plan.flavours[0]
    assert plan.files(runtime.devel) is plan.files(runtime)
    assert plan.flavour_dir(runtime.devel) == plan.flavour_dir(runtime) == ROOT / "Dockerfiles" / runtime.tag


def test_selecting_takes_runtime_images_unless_asked_for_devel_ones() -> None:
    plan = load_plan(ROOT / "matrix.yaml")
    cpu = {"torch_xla": "2.9", "python": "3.11", "accelerator": "cpu"}
    assert [f.tag for f in plan.select(**cpu)] == ["r2.9.0_3.11_cpu"]
    assert [f.tag for f in plan.select(**cpu, variant="devel")] == ["r2.9.0_3.11_cpu_devel"]
    assert [f.tag for f in plan.select(**cpu, variant=None)] == ["r2.9.0_3.11_cpu", "r2.9.0_3.11_cpu_devel"]
    # A name says which image; an alias of the devel image too.
    assert [f.tag for f in plan.select(("latest_cpu_devel", "r2.6.0_3.11_cpu"))] == [
        "r2.9.0_3.11_cpu_devel", "r2.6.0_3.11_cpu"]


@pytest.mark.parametrize(("facts", "variant", "matches"), [
    ({"abi": "cxx11"}, "runtime", True),  # a record written before variants: a runtime image
    ({"abi": "cxx11"}, "devel", False),
    ({"abi": "cxx11", "variant": "devel"}, "devel", True),
    ({"abi": "cxx11", "variant": "devel"}, "runtime", False),
    ({"abi": "cxx11", "variant": "devel"}, None, True),
])
def test_published_facts_match_the_variant_filter(facts: dict[str, str], variant: str | None, matches: bool) -> None:
    assert facts_match(facts, {"abi": "cxx11", "variant": variant}) is matches
