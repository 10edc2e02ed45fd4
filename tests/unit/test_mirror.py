"""run.shipping.mirror: which mirror (option beats site), the reference pulled, and every way the mirror can fail --
each one error under a mirror rule (or the TLS/credential rule that says how to fix it), with nothing tagged.
A fake mirror on loopback answers the preflight; the engine is faked (these are error paths: the real pull
through a real proxy registry is tests/engine/test_pull_mirror.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from support.registry import FakeRegistry, digest_of

from xla_images.errors import ConfigError, Failure
from xla_images.model.registry import Mirror
from xla_images.run import engine
from xla_images.run.shipping import mirror as mirroring
from xla_images.run.registry import PASSWORD_ENV, USER_ENV, RetryPolicy

MANIFEST = b'{"schemaVersion": 2}'
DIGEST = digest_of(MANIFEST)
ORIGIN_REF = f"registry.example.com/team/xla-images@{DIGEST}"
SECRET = "origin-Pa55word!"


class FakeEngine:
    def __init__(self, failure: Failure | None = None) -> None:
        self.failure = failure
        self.pulled: list[str] = []
        self.tagged: list[tuple[str, str, str]] = []

    def pull_image(self, ref: str, auth: dict | None, on_line: Any = None) -> str:
        self.pulled.append(ref)
        if self.failure is not None:
            raise self.failure
        return "sha256:" + "e" * 64

    def tag_image(self, image: str, repository: str, tag: str) -> None:
        self.tagged.append((image, repository, tag))


@pytest.fixture(autouse=True)
def quiet_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No docker config of the machine's, no waiting between retries."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.delenv(USER_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr(mirroring, "PREFLIGHT_RETRY", RetryPolicy(attempts=2, first_wait=0.0, max_wait=0.0))


@pytest.fixture()
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(engine.transfer, "pull_image", fake.pull_image)
    monkeypatch.setattr(engine.images, "tag_image", fake.tag_image)
    return fake


@pytest.fixture()
def mirror() -> Iterator[FakeRegistry]:
    """A mirror that holds the origin's manifest (what a proxy registry serves once it has fetched it)."""
    with FakeRegistry() as registry:
        registry.put_manifest("team/xla-images", None, MANIFEST)
        yield registry


@pytest.fixture()
def fake_mirror(mirror: FakeRegistry) -> str:
    return mirror.host


def pull(host: str) -> mirroring.PulledThrough:
    return mirroring.pull_through(ORIGIN_REF, "r2.9.0_3.11_tpu", Mirror.parse(host), lambda line: None)


# --- which mirror, which reference ---------------------------------------------------------------------------

def test_the_option_beats_the_site_and_neither_is_none() -> None:
    assert mirroring.choose(None, None) is None
    assert mirroring.choose(None, "site.lan:5000") == Mirror("site.lan:5000")
    assert mirroring.choose("option.lan:5000/c", "site.lan:5000") == Mirror("option.lan:5000", "c")


def test_a_bad_value_names_where_it_came_from() -> None:
    with pytest.raises(ConfigError) as from_option:
        mirroring.choose("https://m.lan", "site.lan:5000")
    assert from_option.value.rule == "mirror-format" and "--mirror" in from_option.value.render()
    with pytest.raises(ConfigError) as from_site:
        mirroring.choose(None, "m.lan:5000/")
    assert "site pull_mirror" in from_site.value.render()


def test_the_mirror_ref_keeps_the_repository_and_the_digest() -> None:
    assert mirroring.mirror_ref(ORIGIN_REF, Mirror("m.lan:5000", "cache")) == \
        f"m.lan:5000/cache/team/xla-images@{DIGEST}"


@pytest.mark.parametrize("ref", ["registry.example.com/x:tag", "registry.example.com/x@sha256:abc", "nohost@" + DIGEST])
def test_only_a_digest_reference_goes_to_a_mirror(ref: str) -> None:
    with pytest.raises((Failure, ConfigError)):
        mirroring.mirror_ref(ref, Mirror("m.lan:5000"))


# --- pulling through it --------------------------------------------------------------------------------------

def test_a_served_digest_is_pulled_from_the_mirror_and_tagged_with_the_origin_name(
        fake_mirror: str, fake_engine: FakeEngine) -> None:
    pulled = pull(fake_mirror)
    assert fake_engine.pulled == [f"{fake_mirror}/team/xla-images@{DIGEST}"]
    assert fake_engine.tagged == [(pulled.image_id, "registry.example.com/team/xla-images", "r2.9.0_3.11_tpu")]
    assert pulled.local_ref == "registry.example.com/team/xla-images:r2.9.0_3.11_tpu"


def test_a_mirror_that_does_not_answer_is_one_error_and_nothing_is_pulled_or_tagged(
        fake_engine: FakeEngine) -> None:
    with FakeRegistry() as gone:
        port = gone.port
    # the port is free again: nothing listens there now
    with pytest.raises(Failure) as caught:
        pull(f"127.0.0.1:{port}")
    error = caught.value
    assert error.rule == "mirror-reachable" and f"pull mirror 127.0.0.1:{port}" in error.message
    assert "without --mirror" in (error.hint or "") and "ci/registry.sh start`" not in (error.hint or "")
    assert fake_engine.pulled == [] and fake_engine.tagged == []


@pytest.mark.parametrize("status", [404, 500])
def test_a_mirror_without_the_digest_says_so_before_the_engine_pulls(
        status: int, mirror: FakeRegistry, fake_mirror: str, fake_engine: FakeEngine) -> None:
    # 404: no such manifest; 500: the proxy could not fetch it from its origin
    mirror.fault("HEAD", "/manifests/", (status, {}, b""))
    with pytest.raises(Failure) as caught:
        pull(fake_mirror)
    assert caught.value.rule == "mirror-missing" and fake_mirror in caught.value.message
    assert "without --mirror" in (caught.value.hint or "")
    assert fake_engine.pulled == [] and fake_engine.tagged == []


def test_an_engine_pull_that_fails_is_a_mirror_error_and_tags_nothing(
        fake_mirror: str, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = FakeEngine(Failure("pull of x failed: unexpected EOF", rule="pull"))
    monkeypatch.setattr(engine.transfer, "pull_image", failing.pull_image)
    monkeypatch.setattr(engine.images, "tag_image", failing.tag_image)
    with pytest.raises(Failure) as caught:
        pull(fake_mirror)
    assert caught.value.rule == "mirror-pull" and "unexpected EOF" in caught.value.message
    assert len(failing.pulled) == 1 and failing.tagged == []


def test_the_origin_credentials_of_the_environment_never_reach_the_mirror(
        fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(USER_ENV, "ci-bot")
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    with FakeRegistry(auth="basic", user="ci-bot", password=SECRET) as asking:  # a mirror that asks for Basic
        fake_mirror = asking.host
        with pytest.raises(Failure) as caught:
            pull(fake_mirror)
    assert caught.value.rule == "registry-auth" and "anonymous" in caught.value.message
    assert f"pull mirror {fake_mirror}" in caught.value.message and "without --mirror" in (caught.value.hint or "")
    assert asking.seen and asking.authorizations() == []
    assert SECRET not in caught.value.render() and fake_engine.pulled == []
