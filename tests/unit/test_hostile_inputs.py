"""Hostile input, one case per hole found (issue 11): each is refused with its rule and line, exit 2, quickly.

Cases run through the real CLI (`validate`, `resolve`, `list`) in-process; the ones that would explode
(alias bombs, deep nesting, endless files) also run in a subprocess under a memory and CPU limit.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fs_shapes import plant_no_file
from hostile_inputs import (BOMB, FIXTURE_LOCK, MATRICES_AS_WRITTEN, MATRIX, MATRIX_CASES, ROOT, SITE_CASES,
                            assert_answered, line_of, run_cli, run_limited)
from xla_images import yamlsrc
from xla_images.errors import ConfigError
from xla_images.model import lockfile
from xla_images.model import published as model_published

@pytest.mark.parametrize("text, rule, needle", [case[1:] for case in MATRIX_CASES], ids=[c[0] for c in MATRIX_CASES])
def test_hostile_matrix_is_refused_with_rule_and_line(tmp_path: Path, text: str, rule: str, needle: str | None) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8")
    outcome = run_cli("validate", "--matrix", str(path))
    assert outcome.code == 2, outcome.err
    assert_answered(outcome)
    assert rule in outcome.rules, outcome.err
    line = line_of(text, needle) if needle else 1
    assert f"{path}:{line}: error [{rule}]" in outcome.err, outcome.err


def test_values_as_written_are_still_accepted(tmp_path: Path) -> None:
    # What strictness must not break: unquoted pythons, a BOM, CRLF line ends, float-looking exclude values.
    for name, text in MATRICES_AS_WRITTEN.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8", newline="")
        outcome = run_cli("validate", "--matrix", str(path))
        assert outcome.code == 0, (name, outcome.err)
        assert "valid, 30 flavour(s)" in outcome.out


# --- path arguments ---------------------------------------------------------------------------------------

def _path_of_kind(tmp_path: Path, kind: str) -> Path:
    target = tmp_path / kind
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink-loop":
        target.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(target)
    elif kind == "binary":
        target.write_bytes(b"schema: 1\n\x00\x01\x02" * 10)
    elif kind == "latin-1":
        target.write_bytes("schema: 1\n# caf\u00e9\n".encode("latin-1"))
    elif kind == "oversized":
        target.write_text("# padding\n" * 1_000_000)  # 10 MB: over every input's limit
    elif kind == "device":
        return Path("/dev/zero")
    return target


PATH_KINDS = {"directory": "file-type", "fifo": "file-type", "symlink-loop": "file-readable",
              "binary": "file-encoding", "latin-1": "file-encoding", "oversized": "file-size",
              "device": "file-type", "missing": "file-exists"}


@pytest.mark.parametrize("option", ["--matrix", "--site", "--published"])
@pytest.mark.parametrize("kind", sorted(PATH_KINDS))
def test_every_path_option_refuses_what_is_not_a_small_text_file(tmp_path: Path, option: str, kind: str) -> None:
    path = _path_of_kind(tmp_path, kind)
    if option == "--published":
        args = ["resolve", "--matrix", str(ROOT / "matrix.yaml"), "--published", str(path)]
        if kind == "missing":
            assert run_cli(*args).code == 2  # its own rule: resolve-source
            return
    else:
        args = ["validate", option, str(path)] + (["--matrix", str(ROOT / "matrix.yaml")] if option == "--site" else [])
    outcome = run_cli(*args)
    assert outcome.code == 2, outcome.err
    assert_answered(outcome)
    assert PATH_KINDS[kind] in outcome.rules, outcome.err


# --- site.yaml and --set -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, rule, needle", [case[1:] for case in SITE_CASES], ids=[c[0] for c in SITE_CASES])
def test_hostile_site_is_refused_with_rule_and_line(tmp_path: Path, text: str, rule: str, needle: str | None) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(text, encoding="utf-8")
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--site", str(site))
    assert outcome.code == 2, outcome.err
    assert_answered(outcome)
    line = line_of(text, needle) if needle else 1
    assert f"{site}:{line}: error [{rule}]" in outcome.err, outcome.err


SET_CASES = [
    ("set-aliases", "wheel_sources=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                    "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                    "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]", "yaml-aliases"),
    ("set-tag", "bases={3.11: !!python/name:os.system x}", "yaml-tag"),
    ("set-deep", "wheel_sources=" + "[" * 3000 + "]" * 3000, "yaml-depth"),
    ("set-space-in-base", "bases.3.11=a b", "site-bases"),
    ("set-unknown", "registri=x/y", "site-unknown-key"),
    ("set-no-equals", "registry", "set-syntax"),
    ("set-hex-level", "compression.level=0x3", "site-number"),
    ("set-huge-hex-level", "compression.level=0x" + "f" * 4000, "yaml-value"),  # bounded before conversion
    ("set-hex-in-mapping", "compression={format: zstd, level: 0b11}", "site-number"),
]


@pytest.mark.parametrize("override, rule", [case[1:] for case in SET_CASES], ids=[c[0] for c in SET_CASES])
def test_hostile_set_is_refused_with_rule(override: str, rule: str) -> None:
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--set", override)
    assert outcome.code == 2, outcome.err
    assert_answered(outcome)
    assert rule in outcome.rules, outcome.err
    assert len(outcome.err) < 2000  # the value is not echoed back in full


@pytest.mark.parametrize("secret", ["s3cr3tpassw0rd", "s3cr3t-" + "x" * 200])
def test_credentials_in_a_refused_setting_are_not_echoed(tmp_path: Path, secret: str) -> None:
    """Cut to a readable length, a URL's credentials could no longer be recognised: redacted before the cut."""
    value = f"[{{name: corp, index_url: 'https://user:{secret}@host/simple x'}}]"
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--set", f"wheel_sources={value}")
    assert outcome.code == 2 and "site-wheel-sources" in outcome.rules, outcome.err
    assert "s3cr" not in outcome.err and "***@" in outcome.err, outcome.err
    site = tmp_path / "site.yaml"
    site.write_text(f"wheel_sources: {value}\n")
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--site", str(site))
    assert outcome.code == 2 and "s3cr" not in outcome.err, outcome.err


# --- published.json ------------------------------------------------------------------------------------------

DIGEST = "sha256:" + "a" * 64
GOOD_ENTRY = {"tag": "r2.9.0_3.11_cpu", "tags": ["r2.9.0_3.11_cpu"], "registry": "127.0.0.1:9/x", "digest": DIGEST,
              "ref": f"127.0.0.1:9/x@{DIGEST}", "labels": {}, "flavour": {"python": "3.11"}, "pushed_at": ""}


def _published(**entry_changes: object) -> str:
    entry = {**GOOD_ENTRY, **entry_changes}
    return json.dumps({"schema": 1, "flavours": {"r2.9.0_3.11_cpu": entry}}, indent=2)


PUBLISHED_CASES = [
    ("top-level-list", "[]", "the top level is a list"),
    ("top-level-string", '"published"', "the top level is a str"),
    ("schema-true", '{"schema": true, "flavours": {}}', "schema is True"),
    ("schema-float", '{"schema": 1.0, "flavours": {}}', "schema is 1.0"),
    ("schema-2", '{"schema": 2, "flavours": {}}', "schema is 2"),
    ("flavours-list", '{"schema": 1, "flavours": []}', "`flavours` is not an object"),
    ("digest-is-a-tag", _published(digest="latest"), "is not a sha256:<64 hex> digest"),
    ("digest-newline", _published(digest=DIGEST + "\n"), "is not a sha256:<64 hex> digest"),
    ("tags-string", _published(tags="r2.9.0_3.11_cpu"), "`tags` is not a list"),
    ("flavour-null", _published(flavour=None), "`flavour` is not an object"),
    ("tag-mismatch", _published(tag="latest"), "its `tag` is 'latest'"),
    ("nan", '{"schema": NaN, "flavours": {}}', "NaN is not a value"),
    ("huge-schema-number", '{"schema": ' + "9" * 5000 + ', "flavours": {}}', "a number of 5000 digits"),
    ("deep", "[" * 100_000 + "]" * 100_000, "recursion"),
    ("syntax", '{"schema": 1,\n "flavours": {', "Expecting property name"),
    # promotions (issue 19): read by resolve, merge and prune, validated whole before any of them uses it
    ("promotions-int", _published(promotions=3), "`promotions` is a int"),
    ("promotions-strings", _published(promotions=["127.0.0.1:9/y"]), "promotion 1 is not an object"),
    ("promotions-map", _published(promotions={"registry": "127.0.0.1:9/y"}), "`promotions` is a dict"),
    ("promotion-without-digest", _published(promotions=[{"registry": "127.0.0.1:9/y"}]),
     "promotion 1: `digest` None is not a sha256"),
    ("promotion-bad-registry", _published(promotions=[{"registry": "-x:99999/y", "digest": DIGEST}]),
     "promotion 1: `registry`"),
    ("promotion-twice", _published(promotions=[{"registry": "127.0.0.1:9/y", "digest": DIGEST}] * 2),
     "is promoted to twice"),
    ("registry-not-a-registry", _published(registry="nohost"), "`registry` 'nohost'"),
    ("tags-empty", _published(tags=[]), "`tags` is not a list"),
    ("tag-twice", '{"schema": 1, "flavours": {\n"r2.9.0_3.11_cpu": %s,\n"r2.9.0_3.11_cpu": %s}}'
     % (json.dumps(GOOD_ENTRY), json.dumps(GOOD_ENTRY)), "key 'r2.9.0_3.11_cpu' is written twice"),
    ("field-twice", _published().replace('"pushed_at": ""', '"pushed_at": "",\n"digest": "%s"' % DIGEST),
     "key 'digest' is written twice"),
]


@pytest.mark.parametrize("text, message", [case[1:] for case in PUBLISHED_CASES], ids=[c[0] for c in PUBLISHED_CASES])
def test_hostile_published_json_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "published.json"
    path.write_text(text)
    outcome = run_cli("resolve", "--matrix", str(ROOT / "matrix.yaml"), "--published", str(path))
    assert outcome.code == 2, outcome.err
    assert_answered(outcome)
    assert "published-format" in outcome.rules
    assert message in outcome.err


def test_a_good_published_json_still_parses() -> None:
    entries = model_published.parse_published(_published(), "p.json")
    assert entries["r2.9.0_3.11_cpu"].digest == DIGEST
    promoted = model_published.parse_published(_published(promotions=[{"registry": "127.0.0.1:9/y", "digest": DIGEST,
                                                               "ref": "r", "from": "f", "promoted_at": "t"}]), "p")
    assert promoted["r2.9.0_3.11_cpu"].promotions[0]["registry"] == "127.0.0.1:9/y"


def test_a_tag_written_twice_is_named_at_its_second_line(tmp_path: Path) -> None:
    text = ('{"schema": 1, "flavours": {\n"r2.9.0_3.11_cpu": %s,\n"r2.9.0_3.11_cpu": %s}}'
            % (json.dumps(GOOD_ENTRY), json.dumps(GOOD_ENTRY)))
    with pytest.raises(ConfigError) as caught:
        model_published.parse_published(text, "p.json")
    assert caught.value.location.line == 3


@pytest.mark.parametrize("output", ["file/published.json", "/proc/xla-images-published.json",
                                    "/sys/xla-images-published.json", "folder"])
def test_published_merge_output_of_the_wrong_shape_is_named(tmp_path: Path, output: str) -> None:
    part = tmp_path / "part.json"
    part.write_text(_published())
    (tmp_path / "file").write_text("a file where a folder is named\n")
    (tmp_path / "folder").mkdir()
    target = Path(output) if output.startswith("/") else tmp_path / output
    outcome = run_cli("published", "merge", str(part), "-o", str(target))
    assert outcome.code in (1, 2), outcome.err
    assert_answered(outcome, allowed_failures=frozenset({"disk-write"}))
    assert set(outcome.rules) <= {"disk-write", "disk-type"}, outcome.err
    assert not list(tmp_path.rglob("*.tmp"))


# --- lock files ----------------------------------------------------------------------------------------------

LOCK = FIXTURE_LOCK.read_text()


@pytest.mark.parametrize("text, line", [
    (LOCK.replace("  # torch-", "  # ../../../etc/torch-", 1), "../../../etc/torch-"),
    (LOCK + "x" * 100_000 + "\n", "xxxx"),
    (LOCK + "torch==2.9.0 --hash=sha256:" + "a" * 64 + "  #" + " " * 5000 + "x\n", "  #   "),
    (LOCK + "torch==2.9.0 --hash=sha256:" + "a" * 64 + "\n", "torch==2.9.0 --hash=sha256:aaaa"),
    (LOCK + "Torch_XLA==2.9.0 --hash=sha256:" + "b" * 64 + "\n", "Torch_XLA=="),
    (LOCK + "extra==not-a-version --hash=sha256:" + "c" * 64 + "\n", "extra==not-a-version"),
], ids=["path-in-wheel-name", "huge-line", "long-whitespace", "pinned-twice", "pinned-twice-other-spelling",
        "not-a-version"])
def test_hostile_lock_lines_are_refused_with_line(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        lockfile.parse_lock(text, "requirements.lock")
    assert caught.value.rule == "lock-format"
    assert caught.value.location.line == line_of(text, line)
    assert len(caught.value.render()) < 1000


# Something is there, so not `missing`: `stale` with why (`lock` then names it, e.g. a directory is disk-type).
@pytest.mark.parametrize("kind, state", [("directory", "stale"), ("fifo", "stale"), ("binary", "stale"),
                                         ("oversized", "stale")])
def test_a_lock_that_is_not_a_text_file_is_stale(tmp_path: Path, kind: str, state: str) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    lock = tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "requirements.lock"
    lock.parent.mkdir(parents=True)
    made = _path_of_kind(tmp_path, kind)
    made.rename(lock)
    if kind == "oversized":
        lock.write_text(LOCK + "#\n" * 600_000)
    outcome = run_cli("list", "--json", "--matrix", str(tmp_path / "matrix.yaml"), "--torch-xla", "2.9",
                      "--python", "3.11", "--accelerator", "cpu")
    assert outcome.code == 0, outcome.err
    assert json.loads(outcome.out)[0]["lock"] == state


# --- bounded memory and time, proven in a limited subprocess ------------------------------------------------

@pytest.mark.parametrize("case", ["alias-bomb", "deep-sequence", "self-alias", "long-tag", "huge-git-rev"])
def test_explosive_matrices_answer_within_memory_and_cpu_limits(tmp_path: Path, case: str) -> None:
    text = next(item[1] for item in MATRIX_CASES if item[0] == case)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    outcome = run_limited("validate", "--matrix", str(path))
    assert outcome.code == 2, outcome.err  # a built bomb would die of the limits (exit -9 / MemoryError)
    assert_answered(outcome)


def test_endless_and_blocking_paths_answer_within_limits(tmp_path: Path) -> None:
    fifo = _path_of_kind(tmp_path, "fifo")
    for path in (fifo, Path("/dev/zero"), Path("/dev/urandom")):
        outcome = run_limited("validate", "--matrix", str(path), timeout=30)
        assert outcome.code == 2, outcome.err
        assert "file-type" in outcome.rules


def test_set_bomb_answers_within_limits() -> None:
    override = next(case[1] for case in SET_CASES if case[0] == "set-aliases")
    outcome = run_limited("validate", "--set", override)
    assert outcome.code == 2, outcome.err
    assert "yaml-aliases" in outcome.rules


def test_yaml_limits_are_checked_on_the_composed_graph_not_the_data() -> None:
    # Nine levels of nine aliases: 9**9 values if built. The refusal must come from counting, at once.
    with pytest.raises(ConfigError) as caught:
        yamlsrc.loads(BOMB, "bomb.yaml")
    assert caught.value.rule == "yaml-aliases"
    assert caught.value.location.line <= 6  # refused while composing, well before the last line


def test_a_lock_pinning_a_package_twice_is_stale_not_fresh(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    lock = tmp_path / "Dockerfiles" / "r2.9.0_3.11_cpu" / "requirements.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(LOCK + "torch==2.9.0 --hash=sha256:" + "a" * 64 + "\n")
    outcome = run_cli("list", "--json", "--matrix", str(tmp_path / "matrix.yaml"), "--torch-xla", "2.9",
                      "--python", "3.11", "--accelerator", "cpu")
    assert outcome.code == 0, outcome.err
    assert json.loads(outcome.out)[0]["lock"] == "stale"


# --- numbers and addresses from the command line and the environment -----------------------------------------

@pytest.mark.parametrize("args", [("prune", "--keep", "1", "--older-than", "99999999999"),
                                  ("prune", "--keep", "99999999999999999999", "--older-than", "1"),
                                  ("build", "-j", "100000"), ("promote", "--to", "127.0.0.1:9/x", "--chunk-mb", "1e9")])
def test_numeric_options_beyond_their_bounds_are_usage_errors(args: tuple[str, ...]) -> None:
    outcome = run_cli(*args, "--matrix", str(ROOT / "matrix.yaml"))
    assert outcome.code == 2, outcome.err
    assert "Traceback" not in outcome.err and "Invalid value" in outcome.err


def test_prune_planning_refuses_an_age_past_the_calendar() -> None:
    import datetime

    from xla_images.run.shipping import prune
    with pytest.raises(ConfigError) as caught:
        prune.plan_prune({}, 1, 10 ** 12, {}, datetime.date(2026, 1, 1))
    assert caught.value.rule == "prune-options"


@pytest.mark.parametrize("host", ["tcp://127.0.0.1:99999", "tcp://:x", "tcp://[::1"])
def test_a_docker_host_that_does_not_parse_is_named(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    from xla_images.run.engine import connection
    monkeypatch.setenv("DOCKER_HOST", host)
    connection.client.cache_clear()
    try:
        with pytest.raises(ConfigError) as caught:
            connection.client()
    finally:
        connection.client.cache_clear()
    assert caught.value.rule == "engine-host" and caught.value.location == "DOCKER_HOST"


@pytest.mark.parametrize("under", ["", "/sub"])
def test_a_wheelhouse_that_is_a_file_is_named(tmp_path: Path, under: str) -> None:
    (tmp_path / "file").write_text("x\n")
    outcome = run_cli("wheels", "fetch", "r2.9.0_3.11_cpu", "--matrix", str(ROOT / "matrix.yaml"),
                      "--wheelhouse", str(tmp_path / "file") + under)
    assert outcome.code == 2, outcome.err
    assert outcome.rules == ["disk-type"], outcome.err


@pytest.mark.parametrize("kind, rule", [("fifo", "file-type"), ("directory", "file-type"),
                                        ("dangling", "file-exists")])
def test_a_default_published_json_that_is_no_file_is_an_error_not_a_fallback_to_tags(tmp_path: Path, kind: str,
                                                                                     rule: str) -> None:
    # resolve without --published reads published.json beside the matrix; without one it asks the registry's
    # tags. A fifo, a directory or a dangling link there is a published.json that cannot be read: said, exit 2.
    (tmp_path / "matrix.yaml").write_bytes((ROOT / "matrix.yaml").read_bytes())
    (tmp_path / "matrix.wheels.json").write_bytes((ROOT / "matrix.wheels.json").read_bytes())
    target = tmp_path / "published.json"
    plant_no_file(target, kind)
    outcome = run_cli("resolve", "--matrix", str(tmp_path / "matrix.yaml"))
    assert outcome.code == 2, outcome.err
    assert rule in outcome.rules and "published.json" in outcome.err
