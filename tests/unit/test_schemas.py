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
from typing import Any

import jsonschema
import pytest
import yaml

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
SITE_ONLY_RULES = {"site-registry", "site-pull-mirror", "site-wheel-sources",  # grammars and unique names
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


def test_whatever_the_schema_refuses_in_any_key_the_validator_refuses(tmp_path: Path) -> None:
    """Each key of the frozen matrix replaced by each kind of value: a schema refusal is never a validator
    acceptance (the schema would mark a working matrix red); a validator refusal the schema passes is one of
    the listed rules."""
    disagreements = []
    for path, value in MUTATIONS:
        data = _replaced(FROZEN, path, value)
        rules = _matrix_rules(yaml.dump(data, Dumper=DUMPER, sort_keys=False), tmp_path)
        refused_by_schema = bool(_schema_errors(MATRIX_SCHEMA, data))
        if refused_by_schema and not rules:
            disagreements.append(f"{path} = {value!r}: the schema refuses, the validator accepts")
        elif rules and not refused_by_schema and not set(rules) <= MATRIX_ONLY_RULES:
            disagreements.append(f"{path} = {value!r}: the validator refuses ({rules}), the schema accepts")
    assert len(MUTATIONS) > 500
    assert not disagreements, "\n".join(disagreements[:20])


SITE_BASE = {**_yaml(resources.site_defaults().read_text(encoding="utf-8")), "bases": {"3.11": "python:3.11"},
             "pull_mirror": "mirror.lan:5000", "cosign_public_key": "cosign.pub"}
SITE_MUTATIONS = [(path, value) for path in _paths(SITE_BASE) for value in REPLACEMENTS]


def test_whatever_the_site_schema_refuses_in_any_setting_the_validator_refuses(tmp_path: Path) -> None:
    disagreements = []
    for path, value in SITE_MUTATIONS:
        data = _replaced(SITE_BASE, path, value)
        rules = _site_rules(yaml.dump(data, Dumper=DUMPER, sort_keys=False), tmp_path)
        refused_by_schema = bool(_schema_errors(SITE_SCHEMA, data))
        if refused_by_schema and not rules:
            disagreements.append(f"{path} = {value!r}: the schema refuses, the validator accepts")
        elif rules and not refused_by_schema and not set(rules) <= SITE_ONLY_RULES:
            disagreements.append(f"{path} = {value!r}: the validator refuses ({rules}), the schema accepts")
    assert len(SITE_MUTATIONS) > 200
    assert not disagreements, "\n".join(disagreements[:30])
