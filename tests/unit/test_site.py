"""Site settings: defaults, site.yaml, --set overrides, and their errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from xla_images.errors import ConfigError
from xla_images.model.flavour import Abi
from xla_images.model.site import load_site, parse_override


def test_defaults_use_the_default_index_for_published_abis() -> None:
    site = load_site(None)
    assert site.wheel_source_for("2.6.0", Abi.PRE_CXX11).source.uses_default_index
    assert site.wheel_source_for("2.9.0", Abi.CXX11).source.uses_default_index
    assert site.wheel_source_for("2.9.0", Abi.PRE_CXX11) is None
    assert site.wheel_source_for("2.6.0", Abi.CXX11).source.wheelhouse == "wheelhouse/built"


def test_site_file_overrides_and_keeps_lines(tmp_path: Path) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text("registry: registry.example:5000/team/xla\nbases:\n  \"3.11\": xla-images/base:3.11\n")
    site = load_site(site_file)
    assert site.registry == "registry.example:5000/team/xla"
    assert site.bases == {"3.11": "xla-images/base:3.11"}
    assert site.root == tmp_path


def test_unknown_site_key_names_file_and_line(tmp_path: Path) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text("registry: r:5000/x\nregistery: oops\n")
    with pytest.raises(ConfigError) as caught:
        load_site(site_file)
    assert str(caught.value.location) == f"{site_file}:2"
    assert caught.value.rule == "site-unknown-key"


def test_set_overrides_win_and_keep_version_keys() -> None:
    site = load_site(None, ("registry=127.0.0.1:5001/other", "bases.3.11=xla-images/base:3.11"))
    assert site.registry == "127.0.0.1:5001/other"
    assert site.bases["3.11"] == "xla-images/base:3.11"
    assert parse_override("ca_bundle=none") == (("ca_bundle",), "none")


@pytest.mark.parametrize("override", ["registry", "=x", "colour=blue", "registry=no-slash"])
def test_bad_overrides_are_config_errors(override: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_site(None, (override,))
    assert caught.value.exit_code == 2


def test_ca_bundle_auto_follows_pip_cert(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "corp.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    assert load_site(None).ca_bundle() is None
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert load_site(None).ca_bundle() == bundle
    assert load_site(None, ("ca_bundle=none",)).ca_bundle() is None
    with pytest.raises(ConfigError, match="does not exist"):
        load_site(None, (f"ca_bundle={tmp_path / 'missing.pem'}",)).ca_bundle()


def test_bad_wheel_source_specifier() -> None:
    with pytest.raises(ConfigError) as caught:
        load_site(None, ("wheel_sources=[{name: x, match: {torch_xla: 'two point nine'}}]",))
    assert caught.value.rule == "site-wheel-sources"


def test_pull_mirror_is_off_by_default_and_set_by_file_or_option(tmp_path: Path) -> None:
    assert load_site(None).pull_mirror is None
    site_file = tmp_path / "site.yaml"
    site_file.write_text("pull_mirror: mirror.zone.internal:5000/cache\n", encoding="utf-8")
    assert load_site(site_file).pull_mirror == "mirror.zone.internal:5000/cache"
    assert load_site(site_file, ("pull_mirror=127.0.0.1:5001",)).pull_mirror == "127.0.0.1:5001"
    # `--set pull_mirror=` (empty) turns the site's mirror off; null in a file does too.
    assert load_site(site_file, ("pull_mirror=",)).pull_mirror is None
    site_file.write_text("pull_mirror: null\n", encoding="utf-8")
    assert load_site(site_file).pull_mirror is None


@pytest.mark.parametrize("line", ["pull_mirror: https://mirror:5000", "pull_mirror: [a.b:1]", "pull_mirror: 5000",
                                  "pull_mirror: mirror", "pull_mirror: \"m.lan:1/x y\""])
def test_a_bad_pull_mirror_names_its_line(tmp_path: Path, line: str) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text(f"registry: 127.0.0.1:5000/x\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_site(site_file)
    assert caught.value.rule == "site-pull-mirror" and caught.value.exit_code == 2
    assert f"{site_file}:2" in caught.value.render()


def test_build_cache_is_off_by_default_and_set_by_file_or_option(tmp_path: Path) -> None:
    assert load_site(None).build_cache is None
    site_file = tmp_path / "site.yaml"
    site_file.write_text("build_cache: reg.lan:5000/xla-images-cache\n", encoding="utf-8")
    assert load_site(site_file).build_cache == "reg.lan:5000/xla-images-cache"
    assert load_site(site_file, ("build_cache=",)).build_cache is None


@pytest.mark.parametrize("line", ["build_cache: https://reg:5000/c", "build_cache: [a.b:1/c]", "build_cache: 5000",
                                  "build_cache: \"reg.lan:1/x y\""])
def test_a_bad_build_cache_names_its_line(tmp_path: Path, line: str) -> None:
    site_file = tmp_path / "site.yaml"
    site_file.write_text(f"registry: 127.0.0.1:5000/x\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_site(site_file)
    assert caught.value.rule == "site-build-cache" and caught.value.exit_code == 2
    assert f"{site_file}:2" in caught.value.render()


def test_a_bad_pull_mirror_override_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_site(None, ("pull_mirror=mirror.lan:5000/",))
    assert caught.value.rule == "site-pull-mirror"


def test_credentials_in_a_source_url_are_in_no_fact_that_is_hashed_or_labelled() -> None:
    """WheelSource.to_json goes into lock inputs and flavour ids (an image label): a hash of a weak password is
    a password. Without credentials, the facts are exactly what they were (committed locks stay fresh)."""
    plain = load_site(None, ("wheel_sources=[{name: corp, index_url: 'https://host/simple', "
                             "extra_index_urls: ['https://host/extra'], find_links: ['https://host/links/']}]",))
    secret = load_site(None, ("wheel_sources=[{name: corp, index_url: 'https://u:s3cret@host/simple', "
                              "extra_index_urls: ['https://tok@host/extra'], "
                              "find_links: ['https://u:p@host/links/']}]",))
    facts = secret.wheel_sources[0].source.to_json()
    assert "s3cret" not in repr(facts) and "tok@" not in repr(facts) and "u:p@" not in repr(facts)
    assert facts == plain.wheel_sources[0].source.to_json()
    assert plain.wheel_sources[0].source.to_json()["index_url"] == "https://host/simple"


def test_plain_string_settings_take_hex_looking_text_as_written() -> None:
    """Only YAML-valued settings refuse `0x3` (site-number); a registry or base image is text as written."""
    assert parse_override("bases.3.11=0x3") == (("bases", "3.11"), "0x3")
    assert parse_override("ca_bundle=0x3") == (("ca_bundle",), "0x3")
    with pytest.raises(ConfigError) as caught:
        parse_override("compression.level=0x3")
    assert caught.value.rule == "site-number"
