"""run.shipping.promote's bookkeeping and its error paths (a stand-in client only for those)."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Callable, Iterator

import pytest

from xla_images.errors import Failure
from xla_images.model.flavour import Accelerator
from xla_images.model.registry import Registry
from xla_images.run.shipping import promote
from xla_images.run.registry import RegistryClient
from xla_images.run.registry import RetryPolicy

from lifecycle_data import digest, flavours
from rude_server import Exchange, RudeServer, answer


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


# --- what promote reads, verified (real misbehaving registries on 127.0.0.1) -------------------------------

def rude_registry(started: list[RudeServer], route: Callable[[Exchange], bytes]) -> RegistryClient:
    def script(exchange: Exchange) -> None:
        data = route(exchange)
        if data:
            exchange.send(data)

    started.append(RudeServer(script))
    return RegistryClient(Registry.parse(f"{started[-1].host}/repo"), retry=RetryPolicy(2, 0.0, 0.0), deadline=30.0)


@pytest.fixture
def servers() -> Iterator[list[RudeServer]]:
    started: list[RudeServer] = []
    yield started
    for server in started:
        server.close()


def destination_route(exchange: Exchange) -> bytes:
    if exchange.method == "HEAD":
        return answer(404, {})
    if exchange.method == "POST":
        return answer(202, {"Location": "/v2/repo/blobs/uploads/u1"})
    return answer(201 if exchange.method == "PUT" else 204, {})


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_promote_tags_and_records_only_the_digest_it_asked_for(servers) -> None:
    release = next(f for f in flavours() if f.tag == "r2.9.0_3.11_cpu")
    index = "application/vnd.oci.image.index.v1+json"
    asked = b'{"schemaVersion": 2, "mediaType": "%s", "manifests": []}' % index.encode()
    served = b'{"schemaVersion": 2, "mediaType": "%s", "manifests": [ ]}' % index.encode()

    def route(exchange: Exchange) -> bytes:
        if exchange.method == "HEAD":
            return answer(200, {"Docker-Content-Digest": sha(asked)})
        if exchange.path == "/v2/":
            return answer(200, {})
        return answer(200, {"Content-Type": index}, served)  # another manifest than the digest names

    with pytest.raises(Failure) as caught:
        promote.find_at_source([release], rude_registry(servers, route))
    assert caught.value.rule == "registry-digest" and sha(asked) in caught.value.message


def copy_blob(servers: list[RudeServer], blob_route: Callable[[Exchange], bytes], digest: str, size: int,
              deadline: float = 30.0) -> RudeServer:
    source = rude_registry(servers, blob_route)
    source.deadline = deadline
    destination = rude_registry(servers, destination_route)
    promote.BlobCopier(source, destination).copy(digest, size, promote.Transfer())
    return servers[-1]


def test_a_blob_cut_short_is_a_failure_and_nothing_is_finished(servers) -> None:
    data = b"d" * 1000

    def cut(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {}, data[:500], length=1000))
        exchange.conn.close()
        return b""

    with pytest.raises(Failure) as caught:
        copy_blob(servers, cut, sha(data), 1000)
    assert caught.value.rule == "promote-blob" and "broke off" in caught.value.message
    assert "PUT" not in [method for method, _ in servers[-1].requests]


def test_a_blob_shorter_than_its_descriptor_is_refused(servers) -> None:
    data = b"s" * 500  # whole, and of its digest, but the manifest says 1000 bytes
    with pytest.raises(Failure) as caught:
        copy_blob(servers, lambda exchange: answer(200, {}, data), sha(data), 1000)
    assert caught.value.rule == "promote-blob" and "500 bytes, its manifest says 1000" in caught.value.message
    assert "PUT" not in [method for method, _ in servers[-1].requests]


def test_an_endless_blob_is_cut_at_its_descriptor_size(servers) -> None:
    def endless(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {"Transfer-Encoding": "chunked"}))
        exchange.endless(b"10000\r\n" + b"e" * 0x10000 + b"\r\n")
        return b""

    with pytest.raises(Failure) as caught:
        copy_blob(servers, endless, sha(b"e"), 1000)
    assert caught.value.rule == "promote-blob" and "at most 1000 bytes" in caught.value.message


def test_a_dribbling_blob_is_cut_at_the_deadline(servers) -> None:
    data = b"slow" * 10

    def dribble(exchange: Exchange) -> bytes:
        exchange.send(answer(200, {}, length=len(data)))
        exchange.dribble(data, every=0.3)
        return b""

    with pytest.raises(Failure) as caught:
        copy_blob(servers, dribble, sha(data), len(data), deadline=1.0)
    assert caught.value.rule == "registry-slow"


def test_a_whole_blob_of_its_digest_and_size_is_copied(servers) -> None:
    data = b"w" * 1000
    destination = copy_blob(servers, lambda exchange: answer(200, {}, data), sha(data), 1000)
    assert [method for method, _ in destination.requests] == ["HEAD", "POST", "PUT"]
