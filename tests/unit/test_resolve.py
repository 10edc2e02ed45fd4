"""resolve: exactly one match or a helpful error; re-verification against a (fake) registry."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from targets import make_flavour
from xla_images.errors import Failure
from xla_images.model.flavour import Abi, Accelerator
from xla_images.model.registry import Registry
from xla_images.model import published as model_published
from xla_images.run.shipping import publish, resolve

DIGEST_A, DIGEST_B, DIGEST_C = ("sha256:" + letter * 64 for letter in "abc")


def published(tmp_path: Path, *flavours: tuple[Any, str]) -> Path:
    path = tmp_path / "published.json"
    entries = [model_published.Published(f.tag, f.tags, "127.0.0.1:5000/xla-images", digest, {}, f.to_json(), "now")
               for f, digest in flavours]
    publish.record_published(path, entries)
    return path


@pytest.fixture
def three(tmp_path: Path) -> Path:
    return published(
        tmp_path,
        (make_flavour(), DIGEST_A),
        (make_flavour(python="3.10", aliases=()), DIGEST_B),
        (make_flavour(torch_xla="2.6.0", torch="2.6.0", abi=Abi.PRE_CXX11, release_default_abi=Abi.PRE_CXX11,
                      accelerator=Accelerator.TPU, libtpu="0.0.7.1", aliases=()), DIGEST_C),
    )


def filters(**given: str) -> dict[str, str | None]:
    base: dict[str, str | None] = {"abi": None, "python": None, "torch_xla": None, "accelerator": None}
    base.update(given)
    return base


def test_one_match(three: Path) -> None:
    found = resolve.from_published(three, filters(abi="cxx11", python="3.11"))
    chosen = resolve.choose(found, filters(abi="cxx11", python="3.11"), "published.json")
    assert chosen.ref == f"127.0.0.1:5000/xla-images@{DIGEST_A}"


def test_torch_xla_filter_is_a_version_prefix(three: Path) -> None:
    assert [c.tag for c in resolve.from_published(three, filters(torch_xla="2.6"))] == ["r2.6.0_3.11_tpuvm"]
    assert resolve.from_published(three, filters(torch_xla="2.6.1")) == []
    assert resolve.from_published(three, filters(torch_xla="2")) != []


def test_none_matches_says_so(three: Path) -> None:
    with pytest.raises(Failure) as caught:
        resolve.choose(resolve.from_published(three, filters(python="3.13")), filters(python="3.13"), "p.json")
    assert caught.value.rule == "resolve-one" and "--python 3.13" in caught.value.message


def test_several_match_lists_candidates_and_the_telling_filter(three: Path) -> None:
    wanted = filters(abi="cxx11")
    with pytest.raises(Failure) as caught:
        resolve.choose(resolve.from_published(three, wanted), wanted, "p.json")
    text = caught.value.render()
    assert "r2.9.0_3.10_cpu" in text and "r2.9.0_3.11_cpu" in text and "r2.6.0_3.11_tpuvm" not in text
    assert "--python (3.10 | 3.11)" in caught.value.hint
    assert "--accelerator" not in caught.value.hint  # both candidates are cpu: that filter would not help


class FakeClient:
    def __init__(self, present: set[str] | None, registry: str = "127.0.0.1:5000/xla-images") -> None:
        self.present = present
        self.registry = Registry.parse(registry)
        self.asked: list[str] = []

    def manifest_digest(self, reference: str) -> str | None:
        self.asked.append(reference)
        if self.present is None:
            raise Failure("registry 127.0.0.1:5000 does not answer", rule="registry-reachable")
        return reference if reference in self.present else None

    def check_reachable(self) -> None:
        pass


def test_published_digest_is_reverified(three: Path) -> None:
    fake = FakeClient({DIGEST_A})
    resolved = resolve.resolve_published(three, filters(python="3.11", abi="cxx11"), lambda r: fake, print)
    assert resolved.verified and fake.asked == [DIGEST_A]


def test_digest_gone_from_the_registry_is_a_failure(three: Path) -> None:
    with pytest.raises(Failure) as caught:
        resolve.resolve_published(three, filters(python="3.11", abi="cxx11"), lambda r: FakeClient(set()), print)
    assert caught.value.rule == "resolve-verified" and "build.py push r2.9.0_3.11_cpu" in caught.value.render()


def test_unreachable_registry_warns_and_answers_the_recorded_digest(three: Path) -> None:
    warnings: list[str] = []
    resolved = resolve.resolve_published(three, filters(python="3.11", abi="cxx11"), lambda r: FakeClient(None),
                                         warnings.append)
    assert not resolved.verified and resolved.ref.endswith(DIGEST_A)
    assert warnings and "could not re-verify" in warnings[0]


def test_from_registry_keeps_only_tags_the_registry_serves() -> None:
    flavours = [make_flavour(), make_flavour(python="3.10", aliases=())]
    fake = FakeClient({flavours[1].tag})
    found = resolve.from_registry(flavours, fake, filters(abi="cxx11"))  # type: ignore[arg-type]
    assert [c.tag for c in found] == [flavours[1].tag]
    assert found[0].ref == f"127.0.0.1:5000/xla-images@{flavours[1].tag}"


def test_empty_published_file_is_a_failure(tmp_path: Path) -> None:
    path = published(tmp_path)
    with pytest.raises(Failure, match="lists no published flavour"):
        resolve.from_published(path, filters())


def test_a_devel_image_beside_its_runtime_image_resolves_by_variant(tmp_path: Path) -> None:
    """A flavour's devel image has its runtime image's facts: without --variant the runtime image is the one match,
    `--variant devel` the devel image, and `--variant all` (None) lists both, saying the variant tells them apart."""
    runtime = make_flavour()
    path = published(tmp_path, (runtime, DIGEST_A), (runtime.devel, DIGEST_B))
    answered = {}
    client_for = lambda registry: FakeClient({DIGEST_A, DIGEST_B})  # noqa: E731
    for variant in ("runtime", "devel"):
        given = filters(abi="cxx11", python="3.11") | ({} if variant == "runtime" else {"variant": variant})
        answered[variant] = resolve.resolve_published(path, given, client_for, lambda line: None)
    assert answered["runtime"].tag == runtime.tag and answered["runtime"].ref.endswith(DIGEST_A)
    assert answered["devel"].tag == f"{runtime.tag}_devel" and answered["devel"].ref.endswith(DIGEST_B)
    with pytest.raises(Failure) as raised:
        resolve.resolve_published(path, filters(abi="cxx11", variant=None), client_for, lambda line: None)
    assert "--variant (devel | runtime)" in raised.value.hint
