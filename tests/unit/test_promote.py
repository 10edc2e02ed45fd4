"""run.promote's bookkeeping and its error paths (a stand-in client only for those)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from xla_images.errors import Failure
from xla_images.model.flavour import Accelerator
from xla_images.model.registry import Registry
from xla_images.run import promote
from xla_images.run.publish import RegistryClient

from lifecycle_data import digest, flavours


# --- promote ---------------------------------------------------------------------------------------------

def test_blobs_of_a_manifest_skip_foreign_layers() -> None:
    manifest = {"config": {"digest": digest(1), "size": 10},
                "layers": [{"digest": digest(2), "size": 20}, {"digest": digest(3), "size": 30, "urls": ["x"]}]}
    assert promote.blobs_of(manifest) == [(digest(1), 10), (digest(2), 20)]


class NoSuchTags(RegistryClient):
    """A source that answers but holds only `present` (error paths only; the real flows use registries)."""

    def __init__(self, present: dict[str, str]) -> None:
        super().__init__(Registry.parse("127.0.0.1:5039/stage"))
        self.present = present

    def check_reachable(self) -> None:
        return None

    def manifest_digest(self, reference: str) -> str | None:
        return self.present.get(reference)


def test_every_missing_flavour_is_named_before_anything_is_copied() -> None:
    found = flavours()
    source = NoSuchTags({})
    with pytest.raises(Failure) as caught:
        promote.find_at_source(found[:2], source)
    assert caught.value.rule == "promote-source"
    assert all(flavour.tag in caught.value.message for flavour in found[:2])


def test_tags_that_disagree_at_the_source_are_refused() -> None:
    release = next(f for f in flavours() if f.tag == "r2.9.0_3.11_cpu")
    present = {tag: digest(1) for tag in release.tags} | {release.aliases[0]: digest(2)}
    with pytest.raises(Failure) as caught:
        promote.find_at_source([release], NoSuchTags(present))
    assert "different manifests" in caught.value.message


def test_promoting_onto_itself_is_refused(tmp_path: Path) -> None:
    client = NoSuchTags({})
    with pytest.raises(Failure) as caught:
        promote.promote([], client, client, tmp_path / "published.json")
    assert "both" in caught.value.message


def test_transfer_adds_up() -> None:
    total = promote.Transfer()
    total.add(promote.Transfer(mounted=1, bytes_mounted=5))
    total.add(dataclasses.replace(promote.Transfer(), copied=2, bytes_copied=7))
    assert total.to_json() == {"mounted": 1, "copied": 2, "present": 0, "bytes_mounted": 5, "bytes_copied": 7,
                               "manifests": 0}


def test_accelerators_of_the_nightly_are_both_there() -> None:
    nightlies = [f for f in flavours() if f.is_nightly]
    assert {f.accelerator for f in nightlies} == {Accelerator.TPU, Accelerator.CPU}
