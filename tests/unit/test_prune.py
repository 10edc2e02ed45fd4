"""run.shipping.prune's pure logic: keep/age selection, protect files, published digests and promotions kept, whether the
registry is ours."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from xla_images.errors import ConfigError
from xla_images.model.registry import Registry
from xla_images.run.shipping import prune
from xla_images.run.shipping.publish import record_published
from xla_images.model.published import Published, read_published

from fs_shapes import plant_no_file
from lifecycle_data import digest


# --- prune: keep / age -----------------------------------------------------------------------------------

TODAY = datetime.date(2026, 12, 3)


def test_keep_the_newest_n_and_delete_only_what_is_old() -> None:
    tags = {f"nightly_3.11_cpu_202611{day:02d}": digest(day) for day in range(1, 31)}
    tags |= {"nightly_3.11_cpu": digest(30), "r2.9.0_3.11_cpu": digest(100), "nightly_3.11_tpuvm_20200101": digest(101)}
    plan = prune.plan_prune(tags, keep=3, older_than_days=10, protected={}, today=TODAY)
    deleted = set(plan.deleted_tags)
    # Keep 28, 29, 30 (newest); 23..27 are within 10 days (cutoff 2026-11-23); 1..22 go. The tpu series'
    # single night is its newest: kept. Non-dated tags are never candidates.
    assert deleted == {f"nightly_3.11_cpu_202611{day:02d}" for day in range(1, 23)}
    assert plan.doomed_digests == sorted(digest(day) for day in range(1, 23))


def test_protected_and_still_tagged_digests_are_spared() -> None:
    tags = {"nightly_3.11_cpu_20200101": digest(1), "nightly_3.11_cpu_20200102": digest(2),
            "nightly_3.11_cpu_20200103": digest(3), "nightly_3.11_cpu_20200104": digest(4),
            "r2.9.0_3.11_cpu": digest(2)}
    plan = prune.plan_prune(tags, keep=1, older_than_days=0, protected={digest(3): "named in f"}, today=TODAY)
    reasons = {d.tag: d.reason for d in plan.decisions}
    assert plan.deleted_tags == ["nightly_3.11_cpu_20200101"]
    assert "also tagged r2.9.0_3.11_cpu" in reasons["nightly_3.11_cpu_20200102"]
    assert "protected" in reasons["nightly_3.11_cpu_20200103"]
    assert "newest" in reasons["nightly_3.11_cpu_20200104"]


def test_keep_zero_and_age_zero_deletes_every_dated_tag_but_not_others() -> None:
    tags = {"nightly_3.11_cpu_20261202": digest(1), "nightly_3.11_cpu_20261399": digest(2), "latest": digest(3)}
    plan = prune.plan_prune(tags, keep=0, older_than_days=0, protected={}, today=TODAY)
    assert plan.deleted_tags == ["nightly_3.11_cpu_20261202"]  # 20261399 is no date: not ours to judge


def test_devel_nightlies_are_their_own_series_kept_and_pruned_like_the_runtime_ones() -> None:
    """A night's devel image is tagged `nightly_<...>_<date>_devel`: the same keep/age rules, in a series of its own
    (the runtime's newest night does not keep an old devel night, nor the other way round)."""
    tags = {f"nightly_3.11_cpu_2026110{day}{suffix}": digest(day + (10 if suffix else 0))
            for day in range(1, 5) for suffix in ("", "_devel")}
    tags |= {"nightly_3.11_cpu_devel": digest(14), "r2.9.0_3.11_cpu_devel": digest(100)}
    plan = prune.plan_prune(tags, keep=2, older_than_days=0, protected={}, today=TODAY)
    assert plan.deleted_tags == sorted(f"nightly_3.11_cpu_2026110{day}{suffix}" for day in (1, 2)
                                       for suffix in ("", "_devel"))
    assert prune.dated_nightly("nightly_3.11_cpu_20261101_devel") == ("nightly_3.11_cpu_devel",
                                                                       datetime.date(2026, 11, 1))


def test_negative_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        prune.plan_prune({}, keep=-1, older_than_days=1, protected={}, today=TODAY)


# --- prune: protect files --------------------------------------------------------------------------------

def test_protect_file_lines(tmp_path: Path) -> None:
    path = tmp_path / "protect.txt"
    path.write_text(f"# resolved by downstream CI\n{digest(1)}\n\nreg.example:5000/ml/xla@{digest(2)}  # prod\n")
    assert prune.parse_protect(path) == {digest(1), digest(2)}


@pytest.mark.parametrize("bad", ["latest", f"{digest(1)} extra", "sha256:abc", f"reg/x:tag@{digest(1)[:-1]}"])
def test_a_bad_protect_line_names_file_and_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "protect.txt"
    path.write_text(f"{digest(1)}\n{bad}\n")
    with pytest.raises(ConfigError) as caught:
        prune.parse_protect(path)
    assert caught.value.rule == "protect-format" and str(caught.value.location) == f"{path}:2"


def test_a_missing_protect_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        prune.parse_protect(tmp_path / "absent.txt")
    assert caught.value.rule == "file-exists"  # the bounded reader names it, like every input file


def entry(tag: str, n: int, promotions: tuple = ()) -> Published:
    return Published(tag, (tag,), "reg.example/xla", digest(n), {}, {}, "", promotions)


def test_published_digests_and_promotions_are_protected(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    copy = {"registry": "prod.example/xla", "digest": digest(9), "ref": f"prod.example/xla@{digest(9)}",
            "from": f"reg.example/xla@{digest(1)}", "promoted_at": ""}
    record_published(path, [entry("a", 1, (copy,)), entry("b", 2)])
    assert prune.parse_protect(path) == {digest(1), digest(9), digest(2)}  # a published.json works as --protect
    why = prune.protected_digests(path, [])
    assert set(why) == {digest(1), digest(9), digest(2)} and "published.json (a)" in why[digest(9)]


def test_a_new_push_keeps_the_promotions_already_recorded(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    copy = {"registry": "prod.example/xla", "digest": digest(9), "ref": "r", "from": "f", "promoted_at": ""}
    record_published(path, [entry("a", 1, (copy,))])
    record_published(path, [entry("a", 2)])
    (again,) = read_published(path).values()
    assert again.digest == digest(2) and again.promotions == (copy,)
    assert json.loads(path.read_text())["flavours"]["a"]["promotions"] == [copy]


# --- prune: is the registry ours -------------------------------------------------------------------------

def test_local_registry_detection(tmp_path: Path) -> None:
    directory = tmp_path / "registry" / "5031"
    directory.mkdir(parents=True)
    assert prune.local_registry(Registry.parse("127.0.0.1:5031/x"), tmp_path) is None  # no config
    (directory / "config.yml").write_text(f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n")
    (directory / "registry.pid").write_text("999999999\n")
    assert prune.local_registry(Registry.parse("127.0.0.1:5031/x"), tmp_path) is None  # not running
    (directory / "registry.pid").write_text(f"{os.getpid()}\n")
    found = prune.local_registry(Registry.parse("127.0.0.1:5031/x"), tmp_path)
    assert found is not None and found.data == tmp_path / "data" and found.port == 5031
    assert prune.local_registry(Registry.parse("registry.example:5031/x"), tmp_path) is None  # not loopback


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling"])
def test_a_published_json_that_is_no_file_is_an_error_not_nothing_protected(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "published.json"
    plant_no_file(path, kind)
    with pytest.raises(ConfigError) as caught:
        prune.protected_digests(path, [])
    assert str(path) in caught.value.render()
