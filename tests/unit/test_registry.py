"""model.registry's pull mirror grammar, `HOST[:PORT][/PREFIX]` (the registry grammar itself: test_publish)."""
from __future__ import annotations

import pytest

from xla_images.errors import ConfigError
from xla_images.model.registry import Mirror, Registry, mirror_problem

ORIGIN = Registry.parse("registry.example.com:443/team/xla-images")
DIGEST = "sha256:" + "c" * 64


@pytest.mark.parametrize("text, host, prefix", [
    ("mirror.zone.internal:5000", "mirror.zone.internal:5000", ""),
    ("127.0.0.1:5001", "127.0.0.1:5001", ""),
    ("localhost", "localhost", ""),
    ("[::1]:5000/cache", "[::1]:5000", "cache"),
    ("harbor.zone.internal/proxy/origin-a", "harbor.zone.internal", "proxy/origin-a"),
    ("  mirror.lan:80  ", "mirror.lan:80", ""),
])
def test_mirror_parse(text: str, host: str, prefix: str) -> None:
    mirror = Mirror.parse(text)
    assert (mirror.host, mirror.prefix) == (host, prefix)
    assert mirror_problem(text) is None


def test_the_mirror_serves_the_origin_repository_under_its_prefix() -> None:
    assert Mirror.parse("m.lan:5000").registry_for(ORIGIN).digest_ref(DIGEST) == \
        f"m.lan:5000/team/xla-images@{DIGEST}"
    assert Mirror.parse("m.lan:5000/cache").registry_for(ORIGIN).digest_ref(DIGEST) == \
        f"m.lan:5000/cache/team/xla-images@{DIGEST}"


@pytest.mark.parametrize("text", [
    "", "   ", "https://mirror.lan:5000", "mirror.lan:5000/", "mirror", "mirror.lan:99999", "mirror.lan:0",
    "/cache", "mirror.lan:5000/Upper", "mirror..lan", "-mirror.lan", "mirror.lan:5000//x", "[zz::1]:5000",
    "mirror lan:5000", "user:pw@mirror.lan",
])
def test_mirror_parse_rejects_with_the_option_named(text: str) -> None:
    assert mirror_problem(text) is not None
    with pytest.raises(ConfigError) as caught:
        Mirror.parse(text, where="--mirror")
    assert caught.value.rule == "mirror-format" and caught.value.exit_code == 2
    assert "--mirror" in caught.value.render() and "for example" in caught.value.render()
