"""`build.py published merge`: the CI publish job's union of the per-job published.json parts.

Run through the real command line (exit codes, stderr, no traceback), and its function directly for the rules.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.errors import ConfigError
from xla_images.model import published as model_published
from xla_images.run.shipping import publish

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "127.0.0.1:5000/xla-images"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64


def entry(tag: str, digest: str, registry: str = REGISTRY) -> model_published.Published:
    return model_published.Published(tag, (tag, f"{tag}-alias"), registry, digest, {"org.example": "x"},
                             {"tag": tag}, "2026-12-01T00:00:00+00:00")


def part(root: Path, name: str, *entries: model_published.Published) -> Path:
    """A part as one build job's push leaves it: published.json holding that job's flavours."""
    path = root / "parts" / f"published-{name}" / "published.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    publish.record_published(path, list(entries))
    return path


def merge_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), "published", "merge", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


# --- through the command line -----------------------------------------------------------------------------

def test_good_parts_merge_sorted_in_the_format_push_writes(tmp_path: Path) -> None:
    parts = [part(tmp_path, "c", entry("c", DIGEST_C)), part(tmp_path, "a", entry("a", DIGEST_A)),
             part(tmp_path, "b", entry("b", DIGEST_B))]
    result = merge_cli(tmp_path, *map(str, parts), "-o", "merged.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"a: {REGISTRY}@{DIGEST_A}", f"b: {REGISTRY}@{DIGEST_B}",
                                          f"c: {REGISTRY}@{DIGEST_C}"]
    merged = (tmp_path / "merged.json").read_text()
    assert list(json.loads(merged)["flavours"]) == ["a", "b", "c"]
    # Byte for byte what `push` writes for the same flavours: one writer, not two formats.
    pushed = tmp_path / "pushed.json"
    publish.record_published(pushed, [entry("b", DIGEST_B), entry("c", DIGEST_C), entry("a", DIGEST_A)])
    assert merged == pushed.read_text()
    assert model_published.read_published(tmp_path / "merged.json")["a"].tags == ("a", "a-alias")


def test_output_defaults_to_published_json_and_replaces_it(tmp_path: Path) -> None:
    (tmp_path / "published.json").write_text("stale, and not even JSON")
    source = part(tmp_path, "a", entry("a", DIGEST_A))
    result = merge_cli(tmp_path, str(source))
    assert result.returncode == 0, result.stderr
    assert sorted(model_published.read_published(tmp_path / "published.json")) == ["a"]


def test_a_part_of_another_schema_is_refused_by_name(tmp_path: Path) -> None:
    good = part(tmp_path, "a", entry("a", DIGEST_A))
    other = tmp_path / "parts" / "published-x" / "published.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"schema": 99, "flavours": {}}))
    result = merge_cli(tmp_path, str(good), str(other))
    assert_refused(result, str(other), "schema is 99", "published-format")
    assert not (tmp_path / "published.json").exists()


@pytest.mark.parametrize("text, reason", [
    ("{not json", "published-format"),
    (json.dumps({"schema": 1, "flavours": {"a": {"tag": "a", "tags": ["a"], "registry": REGISTRY,
                                                 "digest": "sha256:short", "flavour": {}}}}), "is not a sha256"),
    (json.dumps({"schema": 1, "flavours": ["a"]}), "`flavours` is not an object"),
])
def test_a_malformed_part_is_refused_with_its_file_named(tmp_path: Path, text: str, reason: str) -> None:
    good = part(tmp_path, "a", entry("a", DIGEST_A))
    bad = tmp_path / "parts" / "published-bad" / "published.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    result = merge_cli(tmp_path, str(good), str(bad))
    assert_refused(result, str(bad), reason)
    assert not (tmp_path / "published.json").exists()


def test_one_tag_with_two_digests_names_both_parts(tmp_path: Path) -> None:
    first = part(tmp_path, "one", entry("a", DIGEST_A))
    second = part(tmp_path, "two", entry("a", DIGEST_B), entry("b", DIGEST_B))
    (tmp_path / "published.json").write_text("kept")
    result = merge_cli(tmp_path, str(first), str(second))
    assert_refused(result, "published-merge", str(first), str(second), DIGEST_A, DIGEST_B)
    assert (tmp_path / "published.json").read_text() == "kept"  # nothing is written on error


def test_one_tag_in_two_registries_is_a_conflict_too(tmp_path: Path) -> None:
    first = part(tmp_path, "one", entry("a", DIGEST_A))
    second = part(tmp_path, "two", entry("a", DIGEST_A, registry="registry.example/xla-images"))
    assert_refused(merge_cli(tmp_path, str(first), str(second)), "published-merge", "registry.example")


def test_the_same_entry_in_two_parts_is_merged_once(tmp_path: Path) -> None:
    # A re-run job uploads its part again under the same tag and digest: that agrees, it is not a conflict.
    first = part(tmp_path, "one", entry("a", DIGEST_A))
    second = part(tmp_path, "two", entry("a", DIGEST_A), entry("b", DIGEST_B))
    result = merge_cli(tmp_path, str(first), str(second))
    assert result.returncode == 0, result.stderr
    assert sorted(model_published.read_published(tmp_path / "published.json")) == ["a", "b"]


def test_no_parts_is_a_usage_error(tmp_path: Path) -> None:
    assert_refused(merge_cli(tmp_path), "no published.json part to merge")
    assert not (tmp_path / "published.json").exists()


def test_a_pattern_the_shell_left_unmatched_says_nothing_was_published(tmp_path: Path) -> None:
    assert_refused(merge_cli(tmp_path, "parts/published-*/published.json"),
                   "no published.json part matches parts/published-*/published.json")


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    good = part(tmp_path, "a", entry("a", DIGEST_A))
    assert_refused(merge_cli(tmp_path, str(good), "parts/gone/published.json"),
                   "parts/gone/published.json", "file not found")
    assert not (tmp_path / "published.json").exists()


def test_parts_without_a_flavour_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"schema": 1, "flavours": {}}))
    assert_refused(merge_cli(tmp_path, str(empty)), "no flavour in 1 published.json part(s)")
    assert not (tmp_path / "published.json").exists()


# --- the function ------------------------------------------------------------------------------------------

def test_merge_keeps_every_field_of_an_entry(tmp_path: Path) -> None:
    promoted = model_published.Published("a", ("a",), REGISTRY, DIGEST_A, {}, {"tag": "a"}, "then",
                                 ({"registry": "prod.example/x", "digest": DIGEST_A, "ref": "prod.example/x@"
                                   + DIGEST_A, "from": REGISTRY, "promoted_at": "later"},))
    merged = publish.merge_published_parts([part(tmp_path, "a", promoted), part(tmp_path, "b", entry("b", DIGEST_B))])
    assert merged["a"] == promoted and merged["b"] == entry("b", DIGEST_B)


def test_merge_error_points_at_the_later_part(tmp_path: Path) -> None:
    first = part(tmp_path, "one", entry("a", DIGEST_A))
    second = part(tmp_path, "two", entry("a", DIGEST_B))
    with pytest.raises(ConfigError) as caught:
        publish.merge_published_parts([first, second])
    assert caught.value.rule == "published-merge" and caught.value.exit_code == 2
    assert caught.value.location is not None and caught.value.location.path == str(second)
