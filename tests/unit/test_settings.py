"""xla_images/settings.py: each setting declared once, and what is derived from it (site.py's keys, validators
and `--set` text keys, the site schema's descriptions, docs/site.md's list, `--set`'s help) agrees with it;
the builder setting read from the environment at the edge and handed on as an argument."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from xla_images import rules, settings
from xla_images.cli import cli
from xla_images.errors import ConfigError, Failure
from xla_images.generate import rulesdoc, schemas
from xla_images.model import site
from xla_images.run import doctor
from xla_images.run.engine import buildkit

ROOT = Path(__file__).resolve().parents[2]


def test_site_keys_and_validators_are_the_declared_settings() -> None:
    assert site.TOP_KEYS == set(settings.SITE_KEYS) == set(site.VALIDATORS)
    assert len(settings.SITE_KEYS) == len(settings.SITE_SETTINGS)  # no setting declared twice


def test_every_declared_rule_is_catalogued() -> None:
    catalogued = {rule.id for rule in rules.CATALOGUE}
    declared = {rule for setting in settings.SETTINGS for rule in setting.rules}
    assert declared and declared <= catalogued, declared - catalogued


def test_scalar_defaults_are_site_defaults_yaml() -> None:
    loaded = site.load_site(None)
    assert f"`{loaded.registry}`" == settings.site_setting("registry").default
    assert f"`{loaded.ca_bundle_setting}`" == settings.site_setting("ca_bundle").default
    assert loaded.pull_mirror is None and settings.site_setting("pull_mirror").default == "none"


@pytest.mark.parametrize("name", sorted(settings.SET_TEXT_KEYS))
def test_a_text_setting_keeps_what_set_gives_as_text(name: str) -> None:
    assert site.parse_override(f"{name}=3.10") == ((name,), "3.10")  # not the float 3.1


def test_a_yaml_setting_reads_set_as_yaml() -> None:
    assert "compression" not in settings.SET_TEXT_KEYS
    assert site.parse_override("compression.level=5") == (("compression", "level"), 5)


def test_errors_come_in_the_declared_order(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("pull_mirror: 'a b'\nregistry: 'no'\ncosign_public_key: 3\n")
    with pytest.raises(ConfigError) as caught:
        site.load_site(path)
    found = [rule for rule in ("site-registry", "site-cosign-public-key", "site-pull-mirror")
             if f"[{rule}]" in caught.value.render()]
    assert found == ["site-registry", "site-cosign-public-key", "site-pull-mirror"]
    text = caught.value.render()
    assert text.index("site-registry") < text.index("site-cosign-public-key") < text.index("site-pull-mirror")


def test_the_site_schema_describes_each_setting_with_its_doc_line() -> None:
    properties = schemas.site_schema()["properties"]
    assert list(properties) == [setting.name for setting in settings.SITE_SETTINGS]
    assert all(properties[s.name]["description"] == s.doc for s in settings.SITE_SETTINGS)
    committed = json.loads((ROOT / schemas.SITE_SCHEMA).read_text())
    assert committed["properties"]["registry"]["description"] == settings.site_setting("registry").doc


def test_the_site_page_lists_every_setting_between_its_markers() -> None:
    text = (ROOT / rulesdoc.SITE_PAGE).read_text()
    assert rulesdoc.site_page(text) == text  # what `render --check` holds too
    block = text[text.index(settings.DOC_BEGIN):text.index(settings.DOC_END)]
    for setting in settings.SITE_SETTINGS:
        assert f"- `{setting.name}` (" in block and setting.doc in block
    assert f"- `{settings.BUILDER.env[0]}` (" in block


def test_a_page_that_lost_its_markers_gets_the_block_back() -> None:
    rendered = rulesdoc.site_page("# Site\n\nprose\n")
    assert rendered.startswith("# Site\n\nprose\n\n" + settings.DOC_BEGIN) and rendered.endswith(settings.DOC_END + "\n")
    edited = rulesdoc.site_page(f"a\n{settings.DOC_BEGIN}\n- stale\n{settings.DOC_END}\nb\n")
    assert "- stale" not in edited and edited.startswith("a\n") and edited.endswith("\nb\n")


def test_set_help_names_every_set_key() -> None:
    result = CliRunner().invoke(cli, ["validate", "--help"])
    assert result.exit_code == 0
    flat = " ".join(result.output.split())
    for setting in settings.SITE_SETTINGS:
        assert setting.set_key in flat


@pytest.mark.parametrize("environ, expected", [({}, "auto"), ({"XLA_IMAGES_BUILDER": " Classic "}, "classic"),
                                               ({"XLA_IMAGES_BUILDER": "buildkit"}, "buildkit")])
def test_the_builder_is_read_from_the_environment(environ: dict[str, str], expected: str) -> None:
    assert settings.read_builder(environ) == expected


def test_the_builder_reaches_the_engine_as_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.BUILDER.env[0], "buildkit")  # the engine no longer reads it: the argument wins
    assert buildkit.use_buildkit("classic") is False


def test_doctor_reports_the_builder_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.BUILDER.env[0], raising=False)
    monkeypatch.setattr(buildkit, "buildx_info", lambda: buildkit.BuildxInfo("v0.0", "docker", None))
    item = doctor.check_buildkit(True, "classic")
    assert "XLA_IMAGES_BUILDER=classic forces the classic builder" in item.detail
    assert "classic" not in doctor.check_buildkit(True, "auto").detail


def test_environment_settings_read_their_variables(tmp_path: Path) -> None:
    assert settings.read_cache_dir({"XLA_IMAGES_CACHE": str(tmp_path)}) == tmp_path
    assert settings.read_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "xla-images"
    assert settings.read_lock_dir({}) == Path("/tmp/xla-images-locks")
    assert settings.read_lock_dir({"XLA_IMAGES_LOCK_DIR": str(tmp_path)}) == tmp_path
    assert settings.read_state_dir({}) == Path("/var/lib/xla-images")
    assert settings.read_state_dir({"XLA_IMAGES_STATE": str(tmp_path)}) == tmp_path
    assert settings.read_ci({"CI": "True"}) and not settings.read_ci({"CI": "0"}) and not settings.read_ci({})
    assert settings.read_pull_stall({}) == settings.PULL_STALL_SECONDS
    assert settings.read_pull_stall({"XLA_IMAGES_PULL_STALL_SECONDS": " 7 "}) == 7.0


@pytest.mark.parametrize("text", ["0", "nan", "abc", "3601"])
def test_a_bad_pull_stall_is_refused_with_its_rule(text: str) -> None:
    with pytest.raises(Failure) as raised:
        settings.read_pull_stall({"XLA_IMAGES_PULL_STALL_SECONDS": text})
    assert raised.value.rule == "pull-stall" and "XLA_IMAGES_PULL_STALL_SECONDS" in raised.value.message


def test_a_child_gets_our_environment_with_its_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOUSE_PROBE", "ours")
    child = settings.child_environment({"PORT": "5000"})
    assert child["HOUSE_PROBE"] == "ours" and child["PORT"] == "5000"


def test_every_environment_setting_is_listed_in_the_site_page() -> None:
    text = (ROOT / rulesdoc.SITE_PAGE).read_text()
    for setting in settings.ENV_SETTINGS:
        assert f"- `{setting.env[0]}` (" in text
