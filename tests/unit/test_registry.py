"""model.registry's pull mirror grammar, `HOST[:PORT][/PREFIX]` (the registry grammar itself: test_publish)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from xla_images import names
from xla_images.errors import ConfigError
from xla_images.model.registry import Mirror, Registry, is_loopback, mirror_problem

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


LOOPBACK = ["127.0.0.1:5000", "localhost:5000", "localhost", "[::1]:5000", "127.0.0.2:5001"]
REMOTE = ["registry.lan:5000", "10.0.0.1:5000", "[2001:db8::1]:5000", "localhost.example.com"]


@pytest.mark.parametrize("host", LOOPBACK + REMOTE)
def test_loopback_is_decided_once_for_the_client_its_hints_and_prune(host: str, tmp_path: Path) -> None:
    """model.registry.is_loopback decides; the registry client's TLS and hints and prune's local registry ask it."""
    from xla_images.run.shipping import prune
    from xla_images.run.registry import errors, tls

    loopback = host in LOOPBACK
    assert is_loopback(host) is loopback
    assert errors.is_loopback is is_loopback and tls.is_loopback is is_loopback
    assert Registry(host, "x").base_url.startswith("http://") is loopback
    port = host.rpartition(":")[2] if ":" in host.rpartition("]")[2] else None
    if port is None:
        return
    directory = tmp_path / names.REGISTRY_STATE_DIR / port
    directory.mkdir(parents=True)
    (directory / names.REGISTRY_CONFIG).write_text("storage: {filesystem: {rootdirectory: /data}}\n")
    (directory / names.REGISTRY_PID_FILE).write_text(f"{os.getpid()}\n")
    found = prune.local_registry(Registry(host, "x"), tmp_path)
    assert (found is not None) is loopback
