"""The nightly channel's pure logic: nightly tags and validation, the lock naming the night, the version gate
(run.checking.nightly_check), and `lock` picking the newest night."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from xla_images.errors import ConfigError, ErrorList, Failure
from xla_images.model import lockfile, nightly
from xla_images.model.flavour import Abi, dev_base, dev_date, nightly_specifier
from xla_images.model.site import load_site
from xla_images.run.checking import nightly_check
from xla_images.run.packages import lock as wheels

from lifecycle_data import NIGHTLY, NIGHTLY_SOURCE, flavours


def errors(text: str, overrides: tuple[str, ...] = (NIGHTLY_SOURCE,)) -> list:
    with pytest.raises(ConfigError) as caught:
        flavours(text, overrides)
    return caught.value.errors if isinstance(caught.value, ErrorList) else [caught.value]


def line(text: str, needle: str, after: str = "") -> int:
    lines = text.splitlines()
    start = next(i for i, row in enumerate(lines) if after in row) if after else 0
    return next(i for i, row in enumerate(lines) if i >= start and needle in row) + 1


# --- nightly: tags and versions --------------------------------------------------------------------------

def test_nightly_tags_follow_upstream_and_are_computed_by_the_flavour() -> None:
    by_tag = {flavour.tag: flavour for flavour in flavours()}
    tpu, cpu = by_tag["nightly_3.11_tpuvm"], by_tag["nightly_3.11_cpu"]
    assert tpu.is_nightly and tpu.nightly_date is None and tpu.tags == ("nightly_3.11_tpuvm",)
    pinned = tpu.with_nightly(torch="2.10.0.dev20261203+cpu", torch_xla="2.10.0.dev20261203")
    assert pinned.tags == ("nightly_3.11_tpuvm", "nightly_3.11_tpuvm_20261203")
    assert pinned.labels["io.xla-images.nightly-date"] == "20261203"
    assert pinned.env["XLA_IMAGES_NIGHTLY_DATE"] == "20261203"
    assert pinned.pinned_versions == {"torch": "2.10.0.dev20261203+cpu", "torch_xla": "2.10.0.dev20261203",
                                      "libtpu": "0.0.21"}
    # The lock asks for any night: the same requirements from one night to the next.
    assert pinned.requirements == tpu.requirements
    assert pinned.requirements[:2] == ("torch>=2.10.0.dev0,<2.10.0a0", "torch_xla>=2.10.0.dev0,<2.10.0a0")
    assert cpu.libtpu is None
    # Releases keep their tags; `latest` stays with the newest release, never a nightly.
    assert "latest" in by_tag["r2.9.0_3.11_tpuvm"].aliases and "latest_cpu" in by_tag["r2.9.0_3.11_cpu"].aliases
    assert "channel" not in by_tag["r2.9.0_3.11_cpu"].to_json()  # release ids do not change


def test_nightly_tag_names_a_non_default_abi() -> None:
    text = NIGHTLY.replace("    channel: nightly\n", "    channel: nightly\n    abis: [cxx11, pre-cxx11]\n")
    source = ("wheel_sources=[{name: n, match: {channel: nightly}, find_links: [x]}, "
              "{name: d, match: {torch_xla: '>=2.7', abi: cxx11}}]")
    tags = {flavour.tag for flavour in flavours(text, (source,))}
    assert {"nightly_3.11_cpu", "nightly_3.11_cpu_precxx11"} <= tags


@pytest.mark.parametrize("version, date, base", [
    ("2.10.0.dev20261203", "20261203", "2.10.0"),
    ("2.10.0.dev20261203+cpu", "20261203", "2.10.0"),
    ("2.10.0", None, None),
    ("2.10.0.dev1", None, None),
    ("2.10.0rc1", None, None),
])
def test_dev_dates(version: str, date: str | None, base: str | None) -> None:
    assert dev_date(version) == date and dev_base(version) == base


def test_nightly_specifier_admits_dev_builds_only() -> None:
    spec = SpecifierSet(nightly_specifier("2.10.0"))
    assert spec.contains("2.10.0.dev20261203") and spec.contains("2.10.0.dev20261203+cpu")
    for other in ("2.10.0", "2.10.0a1", "2.10.0rc1", "2.9.0", "2.11.0.dev20261203"):
        assert not spec.contains(other, prereleases=True), other


# --- nightly: validation ---------------------------------------------------------------------------------

def test_a_nightly_without_a_nightly_wheel_source_names_its_channel_line() -> None:
    found = errors(NIGHTLY, ())
    assert {error.rule for error in found} == {"nightly-wheel-source"}
    assert str(found[0].location) == f"m.yaml:{line(NIGHTLY, 'channel: nightly')}"
    assert "channel: nightly" in found[0].hint and "PyPI has no torch_xla nightlies" in found[0].message


def test_two_nightlies_are_refused() -> None:
    second = NIGHTLY.split('  "2.10.0":\n')[1].replace("torch: \"2.10.0\"", "torch: \"2.11.0\"")
    text = NIGHTLY + '  "2.11.0":\n' + second
    found = [error for error in errors(text) if error.rule == "nightly-unique"]
    assert found and str(found[0].location) == f"m.yaml:{line(text, 'channel: nightly', after='2.11.0')}"


def test_an_unknown_channel_is_a_schema_error() -> None:
    text = NIGHTLY.replace("channel: nightly", "channel: nighty")
    (error,) = errors(text)
    assert error.rule == "schema-type" and str(error.location) == f"m.yaml:{line(text, 'channel: nighty')}"


def test_a_site_channel_must_be_known() -> None:
    with pytest.raises(ConfigError) as caught:
        load_site(None, ("wheel_sources=[{name: n, match: {channel: weekly}}]",))
    assert caught.value.rule == "site-wheel-sources" and "weekly" in caught.value.message


def test_release_sources_do_not_serve_nightlies() -> None:
    site = load_site(None)
    assert site.wheel_source_for("2.10.0", Abi.CXX11) is not None
    from xla_images.model.flavour import Channel
    assert site.wheel_source_for("2.10.0", Abi.CXX11, Channel.NIGHTLY) is None


# --- nightly: the lock names the night -------------------------------------------------------------------

def lock_for(flavour, tmp_path: Path, versions: dict[str, str]) -> Path:
    entries = [lockfile.LockEntry(name, version, "0" * 64, f"{name}-{version}-py3-none-any.whl")
               for name, version in versions.items()]
    path = tmp_path / "Dockerfiles" / flavour.tag / "requirements.lock"
    path.parent.mkdir(parents=True)
    path.write_text(lockfile.format_lock(flavour, "sha256:" + "1" * 64, entries), encoding="utf-8")
    return path


def test_the_lock_pins_the_night(tmp_path: Path) -> None:
    cpu = next(f for f in flavours() if f.tag == "nightly_3.11_cpu")
    lock_for(cpu, tmp_path, {"torch": "2.10.0.dev20261202", "torch-xla": "2.10.0.dev20261203"})
    (pinned,) = nightly.pin_from_locks([cpu], tmp_path)
    assert pinned.nightly_date == "20261203" and pinned.torch == "2.10.0.dev20261202"
    assert pinned.tags == ("nightly_3.11_cpu", "nightly_3.11_cpu_20261203")


def test_a_lock_with_a_release_torch_xla_is_a_located_error(tmp_path: Path) -> None:
    cpu = next(f for f in flavours() if f.tag == "nightly_3.11_cpu")
    path = lock_for(cpu, tmp_path, {"torch": "2.10.0.dev20261203", "torch-xla": "2.9.0"})
    with pytest.raises(ConfigError) as caught:
        nightly.pin_from_locks([cpu], tmp_path)
    number = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if row.startswith("torch-xla=="))
    assert caught.value.rule == "nightly-lock" and str(caught.value.location) == f"{path}:{number}"


# --- nightly: the version gate ---------------------------------------------------------------------------

def pinned_cpu():
    cpu = next(f for f in flavours() if f.tag == "nightly_3.11_cpu")
    return cpu.with_nightly(torch="2.10.0.dev20261203", torch_xla="2.10.0.dev20261203")


def test_a_consistent_image_has_no_mismatch() -> None:
    flavour = pinned_cpu()
    found = nightly_check.Found("2.10.0.dev20261203", "2.10.0.dev20261203+git1a2b3c", "2.10.0.dev20261203",
                          "2.10.0.dev20261203")
    assert nightly_check.mismatches(flavour, flavour.labels, found) == []


def test_a_stale_torch_xla_is_named_with_its_date() -> None:
    flavour = pinned_cpu()
    found = nightly_check.Found("2.10.0.dev20261203", "2.10.0.dev20261115", "2.10.0.dev20261203", "2.10.0.dev20261203")
    (problem,) = nightly_check.mismatches(flavour, flavour.labels, found)
    assert "torch_xla.__version__ is 2.10.0.dev20261115" in problem and "stale build from 20261115" in problem


def test_labels_that_claim_another_night_are_mismatches() -> None:
    flavour = pinned_cpu()
    labels = {**flavour.labels, "io.xla-images.nightly-date": "20261201", "io.xla-images.torch": "2.10.0.dev1"}
    good = nightly_check.Found(*(["2.10.0.dev20261203"] * 4))
    problems = nightly_check.mismatches(flavour, labels, good)
    assert len(problems) == 2 and any("nightly-date" in p for p in problems)


def test_an_unpinned_nightly_is_refused_before_push() -> None:
    cpu = next(f for f in flavours() if f.tag == "nightly_3.11_cpu")
    with pytest.raises(Failure) as caught:
        nightly_check.verify_image(cpu, "xla-images:nightly_3.11_cpu")
    assert caught.value.rule == "nightly-versions" and "build.py lock" in caught.value.hint


# --- nightly: `lock` picks the newest night (pip, local files only) --------------------------------------

def write_wheel(directory: Path, name: str, version: str) -> None:
    """A minimal installable py3-none-any wheel (no RECORD hashes needed for a dry-run resolution)."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{name}/__init__.py", f"__version__ = {version!r}\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")


def test_lock_resolves_the_newest_night_and_the_plan_takes_its_tags(tmp_path: Path) -> None:
    from xla_images.generate.plan import load_plan

    base = "1.99.0"  # low on purpose: some hosts constrain torch to real versions
    for night in ("20261130", "20261201"):
        for name in ("torch", "torch_xla"):
            write_wheel(tmp_path / "nightly-wheels", name, f"{base}.dev{night}")
    write_wheel(tmp_path / "nightly-wheels", "torch_xla", base)  # the release itself is not a nightly
    (tmp_path / "empty-index").mkdir()
    (tmp_path / "matrix.yaml").write_text(textwrap.dedent(f"""\
        schema: 1
        defaults: {{pythons: ["3.11"], accelerators: [cpu], latest_python: "3.11"}}
        releases:
          "{base}": {{channel: nightly, torch: "{base}", pytorch_git_rev: nightly, xla_git_rev: master,
                     python_support: ">=3.11,<3.12"}}
        """))
    (tmp_path / "site.yaml").write_text(textwrap.dedent(f"""\
        ca_bundle: none
        wheel_sources:
          - name: nightly
            match: {{channel: nightly}}
            index_url: {(tmp_path / "empty-index").as_uri()}
            wheelhouse: nightly-wheels
        """))
    plan = load_plan(tmp_path / "matrix.yaml", tmp_path / "site.yaml")
    report = wheels.lock(plan, list(plan.flavours))
    assert not report.failed, [failure.error.render() for failure in report.failed]
    (pinned,) = load_plan(tmp_path / "matrix.yaml", tmp_path / "site.yaml").flavours
    assert pinned.tags == ("nightly_3.11_cpu", "nightly_3.11_cpu_20261201")
    assert pinned.pinned_versions == {"torch": f"{base}.dev20261201", "torch_xla": f"{base}.dev20261201"}
    replanned = load_plan(tmp_path / "matrix.yaml", tmp_path / "site.yaml")
    assert lockfile.lock_status(replanned, pinned).state is lockfile.LockState.FRESH


def test_a_pinned_nightly_renders_its_night_into_the_dockerfile() -> None:
    from xla_images.generate.render import render_flavour

    dockerfile = render_flavour(pinned_cpu())["Dockerfile"]
    assert 'io.xla-images.nightly-date="20261203"' in dockerfile
    assert 'XLA_IMAGES_NIGHTLY_DATE="20261203"' in dockerfile
    assert 'io.xla-images.torch-xla="2.10.0.dev20261203"' in dockerfile
    assert "xla-images nightly_3.11_cpu" in dockerfile
