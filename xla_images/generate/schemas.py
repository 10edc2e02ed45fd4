"""JSON Schemas of matrix.yaml and site.yaml, made from the model's own keys, words and patterns.

An editor with yaml-language-server reads them (the `# yaml-language-server: $schema=schemas/...` line at the
top of matrix.yaml) for completion and inline errors. They are committed and drift-checked like every rendered
file (generate.sync.expected_files). The validator (model.matrix, model.site) stays the authority: a schema
never refuses what the validator accepts, and every field with a pattern takes it from the validator's own
compiled pattern (matrix.PYTHON_SUPPORT, GIT_REV, the versions; registry.IMAGE_REFERENCE; site's), so on those
fields the two accept exactly the same strings. What a schema cannot say (rules across fields: torch-pin,
abi-default, python-supported, exclude-matches, unique-tag, ...; versions as written; registry and mirror hosts,
whose port range and IPv6 check are code) only the validator checks. tests/unit/test_schemas.py holds the two in
agreement on the hostile-input corpus and, field by field, on generated strings (a hypothesis property).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .. import settings
from ..model import compression, matrix, registry, site
from ..model.flavour import COMPANIONS, Abi, Accelerator, Channel

SCHEMAS_DIR = Path("schemas")
MATRIX_SCHEMA = SCHEMAS_DIR / "matrix.schema.json"
SITE_SCHEMA = SCHEMAS_DIR / "site.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _pattern(regex: re.Pattern[str]) -> str:
    """A model pattern (matched with fullmatch, ASCII) as a JSON Schema pattern: anchored, ASCII digits. The end
    is `(?![\\s\\S])` (nothing follows), not `$`: Python's `$`, which the jsonschema library uses, also matches
    before a final newline, so "+cxx11\\n" would pass a schema the validator's fullmatch refuses."""
    return "^(?:" + regex.pattern.replace(r"\d", "[0-9]") + r")(?![\s\S])"


def _words(enum_type: type) -> list[str]:
    return [member.value for member in enum_type]


def _version(regex: re.Pattern[str], example: str) -> dict[str, Any]:
    # A number is read back as written (`3.10` unquoted is the python 3.10), so numbers are versions too.
    return {"anyOf": [{"type": "string", "pattern": _pattern(regex)}, {"type": "number"}],
            "examples": [example]}


def _word_list(enum_type: type) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": _words(enum_type)}}


def _pythons() -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "uniqueItems": True,
            "items": _version(matrix.PYTHON_VERSION, "3.11")}


def _closed(properties: dict[str, Any], keys: set[str], **more: Any) -> dict[str, Any]:
    """An object of exactly the model's keys (the validator's schema-unknown-key)."""
    if set(properties) != keys:  # a key added to the model and not here (or the reverse): a bug, said at once
        raise ValueError(f"schema and model disagree on {sorted(set(properties) ^ keys)}")
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


def matrix_schema() -> dict[str, Any]:
    """matrix.yaml: the keys of model.matrix (TOP_KEYS, DEFAULT_KEYS, RELEASE_KEYS, EXCLUDE_KEYS)."""
    git_rev = {"type": "string", "pattern": _pattern(matrix.GIT_REV), "examples": ["v2.9.0"]}
    defaults = _closed({
        "pythons": _pythons(), "accelerators": _word_list(Accelerator), "abis": _word_list(Abi),
        "default_abi": {"enum": _words(Abi)},
        "latest_python": {"anyOf": [{"const": matrix.NO_LATEST}, _version(matrix.PYTHON_VERSION, "3.11")]},
    }, matrix.DEFAULT_KEYS)
    release = _closed({
        "torch": _version(matrix.PACKAGE_VERSION, "2.9.0"), "pytorch_git_rev": git_rev, "xla_git_rev": git_rev,
        "python_support": {"type": "string", "pattern": _pattern(matrix.PYTHON_SUPPORT),
                           "examples": [">=3.10,<3.14"]},
        "pythons": _pythons(), "accelerators": _word_list(Accelerator), "abis": _word_list(Abi),
        "default_abi": {"enum": _words(Abi)}, "libtpu": _version(matrix.PACKAGE_VERSION, "0.0.21"),
        "channel": {"enum": _words(Channel)},
        # Companions: the versions `update` records (the one whose METADATA pins the release's torch) and which
        # of them the release installs.
        **{name: _version(matrix.PACKAGE_VERSION, example) for name, example in zip(COMPANIONS, ("0.24.0", "2.9.0"))},
        "companions": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(COMPANIONS)}},
    }, matrix.RELEASE_KEYS, required=list(matrix.RELEASE_REQUIRED))
    exclude = _closed({key: {"type": ["string", "number"]} for key in sorted(matrix.EXCLUDE_KEYS)},
                      matrix.EXCLUDE_KEYS, minProperties=1)
    top = _closed({
        "schema": {"const": matrix.SCHEMA_VERSION},
        "defaults": defaults,
        "releases": {"type": "object", "minProperties": 1, "additionalProperties": release,
                     "propertyNames": {"pattern": _pattern(matrix.RELEASE_VERSION)}},
        "exclude": {"type": "array", "maxItems": matrix.MAX_EXCLUDES, "items": exclude},
    }, matrix.TOP_KEYS, required=["schema", "releases"])
    return {"$schema": DIALECT, "$id": f"{MATRIX_SCHEMA.name}", "title": "xla-images matrix.yaml",
            "description": "Which flavours exist (docs/matrix.md). Generated by `build.py render`.", **top}


def _described(properties: dict[str, Any]) -> dict[str, Any]:
    """Each site setting's schema with its doc line (xla_images/settings.py) as the editor's description, in
    the declaration's order."""
    return {setting.name: {"description": setting.doc, **properties[setting.name]}
            for setting in settings.SITE_SETTINGS if setting.name in properties}


def site_schema() -> dict[str, Any]:
    """site.yaml: the settings of model.site (TOP_KEYS, SOURCE_KEYS, MATCH_KEYS) and model.compression.

    Every setting is optional: a site file is merged over the built-in defaults, mappings key by key."""
    plain = {"type": "string", "pattern": _pattern(site._PLAIN)}
    path = {"type": "string", "pattern": _pattern(site._PATH)}
    url = {"type": "string", "pattern": _pattern(site.URL)}
    link = {"type": "string", "pattern": _pattern(site.FIND_LINK)}
    urls = {"anyOf": [url, {"type": "array", "items": url}]}
    match = _closed({"torch_xla": {"type": "string", "maxLength": site.MAX_SPECIFIER, "examples": [">=2.7"]},
                     "abi": {"enum": [*_words(Abi), None]}, "channel": {"enum": _words(Channel)}},
                    site.MATCH_KEYS)
    local = {"type": ["string", "null"], "pattern": _pattern(site.LOCAL_LABEL)}
    source = _closed({
        "name": {"type": "string", "pattern": _pattern(site.SOURCE_NAME)},
        "match": {"anyOf": [match, {"type": "null"}]},
        "index_url": {"anyOf": [url, {"type": "null"}]},
        "extra_index_urls": {"anyOf": [urls, {"type": "null"}]},
        "find_links": {"anyOf": [link, {"type": "array", "items": link}, {"type": "null"}]},
        "wheelhouse": {"anyOf": [path, {"type": "null"}]}, "torch_local": local, "torch_xla_local": local,
    }, site.SOURCE_KEYS, required=["name"])
    levels = compression.ZSTD_LEVELS
    layers = {"type": "object", "properties": {"format": {"enum": list(compression.FORMATS)}, "level": {}},
              "additionalProperties": False,
              # zstd's level (gzip has none: the engine's own, and a level written beside gzip is ignored)
              "if": {"required": ["format"], "properties": {"format": {"const": "gzip"}}}, "then": {},
              "else": {"properties": {"level": {"type": ["integer", "null"], "minimum": levels.start,
                                                "maximum": levels.stop - 1}}}}
    top = _closed(_described({
        "registry": {**plain, "examples": ["127.0.0.1:5000/xla-images"]},
        "ca_bundle": {"anyOf": [path, {"const": ""}, {"type": "null"}], "examples": ["auto", "none"]},
        "bases": {"type": "object", "propertyNames": {"pattern": _pattern(site.BASE_PYTHON)},
                  "additionalProperties": {"type": "string", "pattern": _pattern(registry.IMAGE_REFERENCE),
                                           "examples": ["python:3.11-slim-bookworm"]}},
        "wheel_sources": {"type": "array", "items": source},
        "cosign_public_key": {"anyOf": [path, {"type": "null"}]},
        "compression": layers,
        "pull_mirror": {"anyOf": [plain, {"const": ""}, {"type": "null"}]},
        "build_cache": {"anyOf": [plain, {"const": ""}, {"type": "null"}],
                        "examples": ["127.0.0.1:5000/xla-images-cache"]},
    }), site.TOP_KEYS)
    return {"$schema": DIALECT, "$id": f"{SITE_SCHEMA.name}", "title": "xla-images site.yaml",
            "description": "Site settings (docs/site.md). Generated by `build.py render`.", **top}


def _text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"  # the same bytes whatever the set order


def generated_files() -> dict[Path, str]:
    """The committed schemas, by path relative to the repository root."""
    return {MATRIX_SCHEMA: _text(matrix_schema()), SITE_SCHEMA: _text(site_schema())}
