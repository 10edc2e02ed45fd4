"""Structure-aware fuzz of every input through the real CLI: exit 0, or exit 2 naming file:line and rule.

It extends the text fuzz of tests/unit/test_matrix.py (random text and random dicts fed to `expand`): here
the real matrix.yaml, a realistic site.yaml, `--set` values and a published.json are mutated where they
have structure (a value replaced by an odd scalar, a tagged value, an alias, a deep nest; a key deleted or
added; a node anchored and aliased elsewhere, its own parent included), emitted as YAML with anchors,
aliases and tags, and run through `build.py validate`, `list` and `resolve` in-process. The lock parser is
fuzzed on mutated committed locks.

Budget: derandomized (the same examples every run, so CI is repeatable) and ~40 s in all on a 2-core
machine. Memory and time bounds of the explosive classes are proven in a limited subprocess by
test_hostile_inputs.py; here a hang fails the example through run_cli's alarm. No per-example wall-clock
deadline: on a loaded machine it failed examples that pass (a Flaky error when the re-run was quick).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_inputs import FIXTURE_LOCK, FIXTURE_MATRIX, ROOT, assert_answered, run_cli
from xla_images.errors import ConfigError
from xla_images.model import lockfile

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MATRIX_DATA = yaml.safe_load(FIXTURE_MATRIX.read_text())
SITE_DATA = {
    "registry": "registry.corp.example:5000/ml/xla",
    "ca_bundle": "none",
    "bases": {"3.11": "xla-images/base:3.11"},
    "wheel_sources": [
        {"name": "corp-mirror", "match": {"torch_xla": ">=2.7", "abi": "cxx11"},
         "index_url": "https://pypi.corp.example/simple"},
        {"name": "cxx11-2.6", "match": {"torch_xla": "==2.6.*", "abi": "cxx11"}, "wheelhouse": "wheelhouse/built",
         "torch_local": "+cxx11", "torch_xla_local": "+cxx11"},
    ],
}
DIGEST = "sha256:" + "0" * 64
PUBLISHED_DATA = {"schema": 1, "flavours": {"r2.9.0_3.11_cpu": {
    "tag": "r2.9.0_3.11_cpu", "tags": ["r2.9.0_3.11_cpu", "latest_cpu"], "registry": "127.0.0.1:9/x",
    "digest": DIGEST, "ref": f"127.0.0.1:9/x@{DIGEST}", "labels": {"io.xla-images.abi": "cxx11"},
    "flavour": {"torch_xla": "2.9.0", "python": "3.11", "abi": "cxx11", "accelerator": "cpu"}, "pushed_at": ""}}}
LOCK = FIXTURE_LOCK.read_text()


# --- YAML with anchors, aliases and tags ------------------------------------------------------------------

@dataclass(frozen=True)
class Raw:
    """A YAML fragment written verbatim: a tag, an odd scalar, a deep nest."""

    text: str


@dataclass(frozen=True)
class Anchored:
    """A node given an anchor (`&aN`); aliases emitted later, or inside it, may name it."""

    value: Any


@dataclass(frozen=True)
class Alias:
    """`*aN` naming one of the anchors emitted so far (which may still be open: a cycle)."""

    pick: int


ODD_SCALARS = [
    "~", "null", "''", "yes", "no", "on", "off", "true", "1.0", "3.10", "3.1", "010", "0o17", "0x1f", "1_000",
    ".nan", ".inf", "-.inf", "1.0e+400", "-0", "9" * 30, "9" * 5000, "2024-01-01", "2024-13-45",
    "2001-12-14t21:59:43.10-05:00", "=", '"\\0"', '"\\ud800"', '"\\x07"', '"2.9.0\\n"', '"\u0662.\u0669.\u0660"',
    '"3.11 "', '"v2.9.0; rm -rf /"', '"python:3.11\\nRUN x"', '"\U0001f642"', "cxx11", "pre-cxx11", "tpu", "cpu",
    '"2.9.0"', '"3.11"', '">=3.10,<3.14"', '"+cxx11"', "!!str 3.10", "!!int 1", "!!float 1", "!!binary aGk=",
    "!!python/name:os.system", "!custom x", "!" + "t" * 2000 + " x", "!!set {a: null}", "!!omap [a: 1]",
    "*undefined", "'" + "x" * 100_000 + "'",
]
ODD_KEYS = ["~", "<<", "3.10", "2.9.0", "schema", "pythons", "abis", "default_abi", "latest_python", "torch",
            "libtpu", "match", "name", "bases", "[a, b]", "!tag k", "'\u0662'", '"' + "k" * 500 + '"']


def deep(levels: int) -> Raw:
    return Raw("[" * levels + "1" + "]" * levels)


leaves = st.one_of(
    st.sampled_from(ODD_SCALARS).map(Raw),
    st.builds(Alias, st.integers(0, 20)),
    st.sampled_from([5, 31, 33, 100, 3000]).map(deep),
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12),
)
nodes = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(ODD_KEYS).map(Raw), st.text(max_size=6)), inner, max_size=4),
        st.builds(Anchored, st.one_of(st.lists(inner, min_size=1, max_size=9),
                                      st.dictionaries(st.text(max_size=4), inner, min_size=1, max_size=4))),
    ),
    max_leaves=25,
)


class Emitter:
    """Block style for the top two levels (so errors have distinct lines), flow style below."""

    def __init__(self) -> None:
        self.anchors: list[str] = []

    def document(self, value: Any) -> str:
        if not isinstance(value, dict) or not value:
            return self.flow(value) + "\n"
        lines = []
        for key, item in value.items():
            if isinstance(item, dict) and item:
                lines.append(f"{self.key(key)}:")
                lines.extend(f"  {self.key(k)}: {self.flow(v)}" for k, v in item.items())
            else:
                lines.append(f"{self.key(key)}: {self.flow(item)}")
        return "\n".join(lines) + "\n"

    def key(self, key: Any) -> str:
        return key.text if isinstance(key, Raw) else json.dumps(str(key))

    def flow(self, value: Any) -> str:
        if isinstance(value, Raw):
            return value.text
        if isinstance(value, Alias):
            return f"*{self.anchors[value.pick % len(self.anchors)]}" if self.anchors else "*none_yet"
        if isinstance(value, Anchored):
            name = f"a{len(self.anchors)}"
            self.anchors.append(name)  # before the body: an alias inside it names its own parent
            return f"&{name} {self.flow(value.value)}"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.key(k)}: {self.flow(v)}" for k, v in value.items()) + "}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(self.flow(item) for item in value) + "]"
        if isinstance(value, float) and value != value:
            return ".nan"
        return json.dumps(value)


def emit(value: Any) -> str:
    return Emitter().document(value)


# --- structure-aware mutation ------------------------------------------------------------------------------

def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(paths(item, prefix + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(paths(item, prefix + (index,)))
    return found


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def _parent(tree: Any, path: tuple) -> tuple[Any, Any]:
    node = tree
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """`base` with 1-4 structural edits at paths it really has."""
    tree = _copy(base)
    for _ in range(draw(st.integers(1, 4))):
        candidates = [path for path in paths(tree) if path]
        if not candidates:
            break  # everything deleted
        path = draw(st.sampled_from(candidates))
        try:
            parent, last = _parent(tree, path)
            current = parent[last]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit replaced an ancestor
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "anchor", "wrap"]))
        if action == "replace":
            parent[last] = draw(nodes)
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(current, dict):
            current[draw(st.one_of(st.sampled_from(ODD_KEYS).map(Raw), st.text(max_size=6)))] = draw(nodes)
        elif action == "add" and isinstance(current, list):
            current.append(draw(st.one_of(nodes, st.sampled_from(current or [None]))))
        elif action == "anchor" and isinstance(current, (dict, list)):
            parent[last] = Anchored(current)  # later replacements with Alias may then repeat it
        elif action == "wrap":
            parent[last] = [current] if draw(st.booleans()) else {"k": current}
    return tree


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@settings(FUZZ, max_examples=150)
@given(tree=mutated(MATRIX_DATA), command=st.sampled_from([("validate",), ("list", "--json")]))
def test_fuzz_mutated_matrix_through_the_cli(workdir: Path, tree: Any, command: tuple[str, ...]) -> None:
    path = _write(workdir / "matrix.yaml", emit(tree))
    outcome = run_cli(*command, "--matrix", str(path))
    assert_answered(outcome)
    if outcome.code == 0 and command == ("validate",):
        assert "valid," in outcome.out


def test_fuzz_emitter_reproduces_the_real_matrix(workdir: Path) -> None:
    # The fuzz is only structure-aware if the unmutated tree is the valid matrix.
    outcome = run_cli("validate", "--matrix", str(_write(workdir / "same.yaml", emit(MATRIX_DATA))))
    assert outcome.code == 0, outcome.err
    assert "valid, 30 flavour(s)" in outcome.out


@settings(FUZZ, max_examples=100)
@given(text=st.sampled_from(FIXTURE_MATRIX.read_text().splitlines(keepends=True)).flatmap(
    lambda line: st.tuples(st.just(line), st.sampled_from(ODD_SCALARS + ["&x", "*x", "<<: *x", "- ", "  ", "\t",
                                                                         "{", "]", "#", ":", "---"]))))
def test_fuzz_text_edits_of_the_real_matrix(workdir: Path, text: tuple[str, str]) -> None:
    line, fragment = text
    source = FIXTURE_MATRIX.read_text()
    value_at = line.find(": ") + 2 if ": " in line else len(line.rstrip("\n"))
    edited = source.replace(line, line[:value_at] + fragment + line[value_at:], 1)
    outcome = run_cli("validate", "--matrix", str(_write(workdir / "edited.yaml", edited)))
    assert_answered(outcome)


@settings(FUZZ, max_examples=100)
@given(document=nodes, where=st.sampled_from(["top", "defaults", "release", "pythons", "exclude"]))
def test_fuzz_generated_yaml_in_matrix_positions(workdir: Path, document: Any, where: str) -> None:
    tree: Any = _copy(MATRIX_DATA)
    if where == "top":
        tree = document
    elif where == "defaults":
        tree["defaults"] = document
    elif where == "release":
        tree["releases"]["2.9.0"] = document
    elif where == "pythons":
        tree["defaults"]["pythons"] = document
    else:
        tree["exclude"] = [document]
    outcome = run_cli("validate", "--matrix", str(_write(workdir / "generated.yaml", emit(tree))))
    assert_answered(outcome)


@settings(FUZZ, max_examples=100)
@given(tree=mutated(SITE_DATA))
def test_fuzz_mutated_site_through_the_cli(workdir: Path, tree: Any) -> None:
    site = _write(workdir / "site.yaml", emit(tree))
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--site", str(site))
    assert_answered(outcome)


@settings(FUZZ, max_examples=60)
@given(key=st.sampled_from(["registry", "ca_bundle", "bases", "bases.3.11", "wheel_sources", "wheel_sources.0",
                            "bases.", "registri", ""]),
       value=nodes)
def test_fuzz_set_values_through_the_cli(key: str, value: Any) -> None:
    outcome = run_cli("validate", "--matrix", str(ROOT / "matrix.yaml"), "--set", f"{key}={Emitter().flow(value)}")
    assert_answered(outcome)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80), st.floats(), st.text(max_size=10),
              st.just(DIGEST), st.just("sha256:xyz"), st.just(DIGEST + "\n")),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=10,
)


@st.composite
def mutated_json(draw: st.DrawFn, base: Any) -> Any:
    tree = _copy(base)
    for _ in range(draw(st.integers(1, 3))):
        candidates = [path for path in paths(tree) if path]
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        try:
            parent, last = _parent(tree, path)
        except (KeyError, IndexError, TypeError):
            continue
        if draw(st.booleans()):
            parent[last] = draw(json_values)
        else:
            del parent[last]
    return tree


@settings(FUZZ, max_examples=80)
@given(document=st.one_of(mutated_json(PUBLISHED_DATA), json_values))
def test_fuzz_published_json_through_resolve(workdir: Path, document: Any) -> None:
    published = _write(workdir / "published.json", json.dumps(document))
    # --python 9.99 matches nothing, so a valid file ends in "no match" without asking any registry.
    outcome = run_cli("resolve", "--matrix", str(ROOT / "matrix.yaml"), "--published", str(published),
                      "--python", "9.99")
    assert_answered(outcome, allowed_failures=frozenset({"resolve-one", "resolve-published"}))


@settings(FUZZ, max_examples=150)
@given(position=st.integers(0, len(LOCK)), cut=st.integers(0, 80),
       insertion=st.one_of(st.text(max_size=8), st.sampled_from(["\n", " ", "#", "==", "/", "\x00", "a" * 2000])))
def test_fuzz_lock_files(position: int, cut: int, insertion: str) -> None:
    text = LOCK[:position] + insertion + LOCK[position + cut:]
    try:
        lock = lockfile.parse_lock(text, "requirements.lock")
    except ConfigError as error:
        assert error.rule == "lock-format"
        assert len(error.render()) < 1000
    else:
        assert all("/" not in entry.filename and entry.filename.endswith(".whl") for entry in lock.entries)
