"""matrix.yaml -> validated Flavours, the same on every site (no site settings needed).

Validation collects every error in one pass (file:line, the rule broken, how to fix it) before anything is
rendered or built. Rules, by id (the two that need the site, abi-wheel-source and nightly-wheel-source, are
checked when target.bind binds the flavours to a site):

  schema-*          unknown keys, wrong types, missing fields, unsupported schema version
  version-format    torch_xla/torch/libtpu are X.Y.Z[...], pythons are X.Y
  python-supported  a release builds only pythons in its python_support range
  torch-pin         torch's major.minor equals torch_xla's (upstream pins them together)
  libtpu-pin        a release with tpu flavours pins libtpu exactly
  exclude-matches   every exclude removes at least one flavour
  unique-tag        no two flavours share a tag, and no alias is another flavour's tag
  nightly-unique    at most one release has `channel: nightly` (its tags carry no version)
  git-rev           pytorch_git_rev/xla_git_rev are git tags, branches or commits (no spaces or shell syntax)
  abi-default       a release's default_abi is one of the abis it builds
  latest-python     defaults.latest_python is a python some release builds (or `none`: nothing carries latest)
  schema-duplicate  a list names the same python, accelerator or abi twice
  matrix-size       at most MAX_FLAVOURS flavours and MAX_EXCLUDES excludes, so every command answers quickly
  companion-*       `companions:` names torchvision/torchaudio only (companion-name), each with the version the
                    release records (companion-version), in releases that build only their default ABI, the one
                    the index's companion wheels are built for (companion-abi)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import yamlsrc
from ..errors import ConfigError, ErrorList, Location, XlaImagesError, shown_value
from .flavour import (COMPANIONS, Abi, Accelerator, AnyFlavour, Channel, Flavour, abi_suffix, make_tag_prefix,
                      minor)

SCHEMA_VERSION = 1
TOP_KEYS = {"schema", "defaults", "releases", "exclude"}
DEFAULT_KEYS = {"pythons", "accelerators", "default_abi", "abis", "latest_python"}
RELEASE_KEYS = {"torch", "pytorch_git_rev", "xla_git_rev", "python_support", "pythons", "accelerators", "abis",
                "default_abi", "libtpu", "channel", "companions", *COMPANIONS}
RELEASE_REQUIRED = ("torch", "pytorch_git_rev", "xla_git_rev", "python_support")
EXCLUDE_KEYS = {"torch_xla", "python", "abi", "accelerator"}
# Matched with fullmatch and ASCII digits: "2.9.0\n" and "٢.٩.٠" are not versions (and would break Version()).
# A number has no leading zero: `3.010` is the version 3.10 written another way (a second tag for one python).
# These patterns are the grammar: the JSON Schemas are generated from them (generate.schemas), so the two agree.
_NUMBER = r"(?:0|[1-9][0-9]{0,3})"
RELEASE_VERSION = re.compile(rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}", re.ASCII)
PACKAGE_VERSION = re.compile(rf"{_NUMBER}(\.(?:0|[1-9][0-9]{{0,5}})){{1,3}}([a-z]{{1,5}}[0-9]{{1,4}})?", re.ASCII)
PYTHON_VERSION = re.compile(r"3\.(?:0|[1-9][0-9]{0,2})", re.ASCII)
# What build-wheels.sh checks out: a tag, branch or commit (or a hex SHA, which the same grammar admits). Plain
# characters only (it lands in a script and a .env file), and git's own ref-name rules (git check-ref-format):
# no `..` (a path out of the tree: v2.9.1/../../etc/passwd), no component starting with `.` or ending `.lock`,
# no `//`, no trailing `/` or `.`. Control characters, space, ~ ^ : ? * [ \\ and `@{` are outside the characters.
GIT_REV = re.compile(r"(?!.*\.\.)(?!.*//)(?!.*/\.)(?!.*\.lock(?:/|$))(?!.*[/.]$)[A-Za-z0-9][A-Za-z0-9._/+-]{0,127}",
                     re.ASCII)
# python_support: comma-joined clauses `OP VERSION` that packaging.specifiers reads, an ASCII space around each,
# wildcards (3.10.*) only after == and !=, ~= with two or more numbers. Narrower than packaging (no `v3.10`, no
# trailing comma, no Unicode spaces), so the schema generated from it refuses exactly what the validator does.
_SUPPORT_VERSION = r"[0-9]{1,4}(?:\.[0-9]{1,4}){0,2}"
_SUPPORT_CLAUSE = (rf" ?(?:(?:==|!=) ?{_SUPPORT_VERSION}(?:\.\*)?|~= ?[0-9]{{1,4}}(?:\.[0-9]{{1,4}}){{1,2}}"
                   rf"|(?:<=|>=|<|>) ?{_SUPPORT_VERSION}) ?")
PYTHON_SUPPORT = re.compile(rf"{_SUPPORT_CLAUSE}(?:,{_SUPPORT_CLAUSE}){{0,15}}", re.ASCII)
# Beyond these the matrix is surely not hand-written; refusing keeps every command well under a second.
MAX_FLAVOURS = 2000
# `latest_python: none`: no flavour carries `latest`/`latest_cpu` (a staging matrix, or tests on a shared engine).
NO_LATEST = "none"
MAX_EXCLUDES = 500
KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Release:
    torch_xla: str
    torch: str
    pytorch_git_rev: str
    xla_git_rev: str
    python_support: SpecifierSet
    pythons: tuple[str, ...]
    accelerators: tuple[Accelerator, ...]
    abis: tuple[Abi, ...]
    default_abi: Abi
    libtpu: str | None
    declared_at: Location
    channel: Channel = Channel.RELEASE
    companion_versions: tuple[tuple[str, str], ...] = ()
    companions: tuple[str, ...] = ()


class _Collector:
    """Gathers errors so one run of `validate` reports all of them."""

    def __init__(self, doc: yamlsrc.YamlDoc) -> None:
        self.doc = doc
        self.errors: list[XlaImagesError] = []

    def error(self, keys: KeyPath, message: str, rule: str, hint: str | None = None) -> None:
        self.errors.append(ConfigError(message, location=self.doc.loc(keys), rule=rule, hint=hint))

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ErrorList(self.errors)


def load_flavours(matrix_path: Path) -> list[Flavour]:
    """Parse, validate and expand the matrix. Raises ConfigError/ErrorList listing every problem."""
    doc = yamlsrc.load(matrix_path)
    return expand(doc)


def expand(doc: yamlsrc.YamlDoc) -> list[Flavour]:
    errors = _Collector(doc)
    data = doc.data
    if not isinstance(data, dict):
        errors.error((), "the matrix must be a mapping with `releases`", "schema-type",
                     "start from the matrix.yaml in the repository; see docs/matrix.md")
        errors.raise_if_any()
    _check_keys(errors, data, (), TOP_KEYS, "top level")
    _check_schema_version(errors, data)
    defaults = _defaults(errors, data.get("defaults", {}))
    releases = _releases(errors, data.get("releases"), defaults)
    excludes = _excludes(errors, data.get("exclude", []))
    errors.raise_if_any()
    _check_latest_python(errors, data.get("defaults", {}), defaults, releases)
    _check_size(errors, releases, excludes)
    errors.raise_if_any()
    flavours = _flavours(errors, releases, excludes)
    errors.raise_if_any()
    flavours = _with_aliases(flavours, str(defaults["latest_python"]))
    _check_unique_tags(errors, flavours)
    errors.raise_if_any()
    return flavours


def matrix_defaults(doc: yamlsrc.YamlDoc) -> dict[str, Any]:
    """The `defaults` section as releases inherit it (pythons, accelerators, abis, ...); raises if invalid."""
    errors = _Collector(doc)
    data = doc.data if isinstance(doc.data, dict) else {}
    result = _defaults(errors, data.get("defaults", {}))
    errors.raise_if_any()
    return result


def _check_latest_python(errors: _Collector, given: dict, defaults: dict[str, Any],
                         releases: list[Release]) -> None:
    latest = defaults["latest_python"]
    built = {python for release in releases for python in release.pythons}
    if releases and latest != NO_LATEST and latest not in built:
        at: KeyPath = ("defaults", "latest_python") if "latest_python" in given else ("defaults",)
        errors.error(at, f"latest_python {latest} is built by no release, so nothing would carry `latest`",
                     "latest-python", f"set it to one of: {', '.join(sorted(built, key=Version))}, or `none` "
                     "for no `latest` tags")


def _check_size(errors: _Collector, releases: list[Release], excludes: list) -> None:
    count = sum(len(r.pythons) * len(r.accelerators) * len(r.abis) for r in releases)
    if count > MAX_FLAVOURS:
        errors.error(("releases",), f"the matrix expands to {count} flavours, more than {MAX_FLAVOURS}",
                     "matrix-size", "split it into several matrix files, or narrow pythons/accelerators/abis")
    if len(excludes) > MAX_EXCLUDES:
        errors.error(("exclude",), f"{len(excludes)} excludes, more than {MAX_EXCLUDES}", "matrix-size",
                     "list the pythons or accelerators a release builds instead of excluding them one by one")


# --- schema -----------------------------------------------------------------------------------------------

def _check_keys(errors: _Collector, mapping: dict, keys: KeyPath, allowed: set[str], what: str) -> None:
    for key in mapping:
        if key not in allowed:
            close = _closest(key, allowed) if len(key) < 100 else None
            errors.error(keys + (key,), f"unknown key {shown_value(key)} in {what}", "schema-unknown-key",
                         f"did you mean {close!r}?" if close else f"allowed keys: {', '.join(sorted(allowed))}")


def _closest(word: str, choices: set[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, sorted(choices), n=1)
    return found[0] if found else None


def _check_schema_version(errors: _Collector, data: dict) -> None:
    if "schema" not in data:
        errors.error((), "missing `schema: 1` at the top of the matrix", "schema-missing",
                     "add the line `schema: 1`")
    elif type(data["schema"]) is not int:  # noqa: E721 -- 1.0 and true equal 1 in Python, but are not `1`
        errors.error(("schema",), f"schema must be the integer {SCHEMA_VERSION}, not "
                     f"{shown_value(errors.doc.text(('schema',)) or data['schema'])}", "schema-type",
                     f"write `schema: {SCHEMA_VERSION}`")
    elif data["schema"] != SCHEMA_VERSION:
        errors.error(("schema",), f"unsupported schema {shown_value(data['schema'])}", "schema-version",
                     f"this xla-images reads schema {SCHEMA_VERSION}")


def _version_text(errors: _Collector, keys: KeyPath, value: Any, pattern: re.Pattern[str], what: str,
                  example: str) -> str | None:
    """A version as the user wrote it: unquoted `3.10` is read back from the raw text, not the float 3.1."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        errors.error(keys, f"{what} must be a version string like {example}", "schema-type",
                     f'write it as a quoted string, e.g. "{example}"')
        return None
    # Numbers are read back as written: `3.10` is not 3.1, and `010` is not the octal 8.
    text = errors.doc.text(keys) if isinstance(value, (int, float)) else None
    text = text or str(value)
    if not pattern.fullmatch(text):
        if not _non_canonical(errors, keys, text, what, pattern):
            errors.error(keys, f"{what} {shown_value(text)} is not a version like {example}", "version-format",
                         f'write it as a quoted string, e.g. "{example}"')
        return None
    return text


_LEADING_ZERO = re.compile(r"(?:^|\.)0\d", re.ASCII)


def _non_canonical(errors: _Collector, keys: KeyPath, text: str, what: str, pattern: re.Pattern[str]) -> bool:
    """A version with a leading zero (`3.010`, `02.9.0`) is the same version as its canonical form (packaging:
    Version("3.010") == Version("3.10")) but would make another tag and name no real python or wheel: refused
    (the pattern has no leading zeros), and said so when the canonical form is a version of the pattern."""
    if not (text.isascii() and _LEADING_ZERO.search(text)):
        return False
    try:
        canonical = str(Version(text))
    except InvalidVersion:
        return False
    if not pattern.fullmatch(canonical):
        return False
    errors.error(keys, f"{what} {text} is {canonical} written with a leading zero", "version-format",
                 f'write it as "{canonical}" (versions compare by value: {text} and {canonical} are one version)')
    return True


def _git_rev(errors: _Collector, keys: KeyPath, value: Any, what: str) -> str | None:
    if not isinstance(value, str) or not value:
        errors.error(keys, f"{what} must be a non-empty string", "schema-type",
                     "give the git tag or commit to build from, e.g. v2.9.0")
        return None
    if not GIT_REV.fullmatch(value):
        errors.error(keys, f"{what} {shown_value(value)} is not a git tag, branch or commit", "git-rev",
                     "letters, digits and . _ / + - (at most 128) by git's ref-name rules: no `..`, `//`, "
                     "component starting with `.` or ending `.lock`, trailing `/` or `.`; e.g. v2.9.0")
        return None
    return value


def _enum_list(errors: _Collector, keys: KeyPath, value: Any, enum_type: type, what: str) -> tuple:
    allowed = [member.value for member in enum_type]
    if not isinstance(value, list) or not value:
        errors.error(keys, f"{what} must be a non-empty list of {', '.join(allowed)}", "schema-type",
                     f"for example [{allowed[0]}]")
        return ()
    result = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or item not in allowed:
            errors.error(keys + (index,), f"unknown {what[:-1]} {shown_value(item)}", "schema-type",
                         f"use one of: {', '.join(allowed)}")
        elif enum_type(item) in result:
            errors.error(keys + (index,), f"{what[:-1]} {item} is listed twice", "schema-duplicate",
                         "list each once")
        else:
            result.append(enum_type(item))
    return tuple(result)


def _enum_value(errors: _Collector, keys: KeyPath, value: Any, enum_type: type, what: str):
    allowed = [member.value for member in enum_type]
    if not isinstance(value, str) or value not in allowed:
        errors.error(keys, f"unknown {what} {shown_value(value)}", "schema-type", f"use one of: {', '.join(allowed)}")
        return None
    return enum_type(value)


def _python_list(errors: _Collector, keys: KeyPath, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        errors.error(keys, "pythons must be a non-empty list of versions like \"3.11\"", "schema-type",
                     'for example ["3.10", "3.11"]')
        return ()
    pythons = []
    for index, item in enumerate(value):
        text = _version_text(errors, keys + (index,), item, PYTHON_VERSION, "python", "3.11")
        if text and text in pythons:
            errors.error(keys + (index,), f"python {text} is listed twice", "schema-duplicate", "list each once")
        elif text:
            pythons.append(text)
    return tuple(pythons)


# --- sections ---------------------------------------------------------------------------------------------

def _defaults(errors: _Collector, value: Any) -> dict[str, Any]:
    keys: KeyPath = ("defaults",)
    result: dict[str, Any] = {
        "pythons": (), "accelerators": (Accelerator.TPU,), "default_abi": Abi.CXX11, "abis": (Abi.CXX11,),
        "latest_python": "3.11",
    }
    if not isinstance(value, dict):
        errors.error(keys, "defaults must be a mapping", "schema-type", "for example defaults: {pythons: [\"3.11\"]}")
        return result
    _check_keys(errors, value, keys, DEFAULT_KEYS, "defaults")
    if "pythons" in value:
        result["pythons"] = _python_list(errors, keys + ("pythons",), value["pythons"])
    if "accelerators" in value:
        result["accelerators"] = _enum_list(errors, keys + ("accelerators",), value["accelerators"], Accelerator,
                                            "accelerators")
    if "abis" in value:
        result["abis"] = _enum_list(errors, keys + ("abis",), value["abis"], Abi, "abis")
    if "default_abi" in value:
        result["default_abi"] = _enum_value(errors, keys + ("default_abi",), value["default_abi"], Abi, "abi")
    if value.get("latest_python") == NO_LATEST:
        result["latest_python"] = NO_LATEST
    elif "latest_python" in value:
        result["latest_python"] = _version_text(errors, keys + ("latest_python",), value["latest_python"],
                                                PYTHON_VERSION, "python", "3.11")
    _check_default_abi(errors, keys, value, result["default_abi"], result["abis"])
    return result


def _check_default_abi(errors: _Collector, keys: KeyPath, settings: dict, default_abi: Abi | None,
                       abis: tuple[Abi, ...]) -> None:
    """A default_abi written in a section must be among the abis that section builds.

    It decides which flavour has no ABI word in its tag and carries `latest`. An inherited default with a
    release's own `abis` stays allowed: that is how a release builds only its other ABI (docs/matrix.md, the flavour table).
    """
    if default_abi is None or not abis or default_abi in abis or "default_abi" not in settings:
        return
    at = keys + ("default_abi",)
    errors.error(at, f"default_abi {default_abi.value} is not among the abis built "
                 f"({', '.join(abi.value for abi in abis)})", "abi-default",
                 f"add {default_abi.value} to abis, or set default_abi to one of them")


def _releases(errors: _Collector, value: Any, defaults: dict[str, Any]) -> list[Release]:
    if value is None:
        errors.error((), "missing `releases`", "schema-missing", "declare at least one torch_xla release")
        return []
    if not isinstance(value, dict) or not value:
        errors.error(("releases",), "releases must be a mapping of torch_xla version -> settings", "schema-type",
                     'for example releases: {"2.9.0": {torch: "2.9.0", ...}}')
        return []
    releases = []
    for version, settings in value.items():
        release = _release(errors, ("releases", version), version, settings, defaults)
        if release is not None:
            releases.append(release)
    _check_one_nightly(errors, releases)
    return sorted(releases, key=lambda release: Version(release.torch_xla))


def _release(errors: _Collector, keys: KeyPath, version: str, settings: Any, defaults: dict) -> Release | None:
    before = len(errors.errors)
    if not RELEASE_VERSION.fullmatch(version) and not _non_canonical(errors, keys, version, "release",
                                                                     RELEASE_VERSION):
        errors.error(keys, f"release key {shown_value(version)} is not a torch_xla version like 2.9.0",
                     "version-format", 'quote it: "2.9.0"')
    if not isinstance(settings, dict):
        errors.error(keys, "a release must be a mapping of settings", "schema-type",
                     "give torch, pytorch_git_rev, xla_git_rev, python_support and libtpu under it")
        return None
    _check_keys(errors, settings, keys, RELEASE_KEYS, f"release {version}")
    for required in RELEASE_REQUIRED:
        if required not in settings:
            errors.error(keys, f"release {version} is missing `{required}`", "schema-missing",
                         f"add `{required}:` under releases.{version}")
    torch = _version_text(errors, keys + ("torch",), settings.get("torch", "0.0.0"), PACKAGE_VERSION, "torch",
                          "2.9.0")
    support = (_python_support(errors, keys + ("python_support",), settings["python_support"])
               if "python_support" in settings else None)
    pythons = (_python_list(errors, keys + ("pythons",), settings["pythons"]) if "pythons" in settings
               else tuple(p for p in defaults["pythons"] if support is not None and support.contains(p + ".0")))
    accelerators = (_enum_list(errors, keys + ("accelerators",), settings["accelerators"], Accelerator,
                               "accelerators") if "accelerators" in settings else defaults["accelerators"])
    abis = (_enum_list(errors, keys + ("abis",), settings["abis"], Abi, "abis") if "abis" in settings
            else defaults["abis"])
    default_abi = (_enum_value(errors, keys + ("default_abi",), settings["default_abi"], Abi, "abi")
                   if "default_abi" in settings else defaults["default_abi"])
    channel = (_enum_value(errors, keys + ("channel",), settings["channel"], Channel, "channel")
               if "channel" in settings else Channel.RELEASE)
    _check_default_abi(errors, keys, settings, default_abi, abis)
    libtpu = None
    if "libtpu" in settings:
        libtpu = _version_text(errors, keys + ("libtpu",), settings["libtpu"], PACKAGE_VERSION, "libtpu",
                               "0.0.21")
    revs = [_git_rev(errors, keys + (name,), settings.get(name), name) if name in settings else None
            for name in ("pytorch_git_rev", "xla_git_rev")]
    companion_versions = tuple((name, _version_text(errors, keys + (name,), settings[name], PACKAGE_VERSION, name,
                                                    "0.24.0")) for name in COMPANIONS if name in settings)
    companions = (_companions(errors, keys, version, settings, dict(companion_versions), abis, default_abi)
                  if "companions" in settings else ())
    if len(errors.errors) > before:
        return None  # rules below would only repeat what the schema errors already say
    _check_release_rules(errors, keys, version, torch, support, pythons, accelerators, libtpu, settings)
    if len(errors.errors) > before:
        return None
    return Release(version, str(torch), str(revs[0]), str(revs[1]), support, pythons, accelerators, abis,
                   default_abi, libtpu, errors.doc.loc(keys), channel,
                   tuple((name, str(text)) for name, text in companion_versions), companions)


def _companions(errors: _Collector, keys: KeyPath, version: str, settings: dict, versions: dict[str, str | None],
                abis: tuple[Abi, ...], default_abi: Abi | None) -> tuple[str, ...]:
    """The companions a release installs: known names, each once, each with its recorded version; and only in
    the release's default ABI, the one the index's companion wheels are built for (2.6's torchvision 0.21.0 is
    pre-C++11 like its torch: in a C++11 image its extension would not load)."""
    value, at = settings["companions"], keys + ("companions",)
    if not isinstance(value, list) or not value:
        errors.error(at, "companions must be a non-empty list of package names", "schema-type",
                     f"for example companions: [{COMPANIONS[0]}]")
        return ()
    names: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or item not in COMPANIONS:
            close = _closest(item, set(COMPANIONS)) if isinstance(item, str) and len(item) < 100 else None
            errors.error(at + (index,), f"unknown companion {shown_value(item)}", "companion-name",
                         (f"did you mean {close!r}? " if close else "") + f"companions are {', '.join(COMPANIONS)}")
        elif item in names:
            errors.error(at + (index,), f"companion {item} is listed twice", "schema-duplicate", "list each once")
        elif item not in versions:
            errors.error(at + (index,), f"release {version} installs {item} but records no {item} version",
                         "companion-version", "run `./build.py update --write`: it learns from the index the "
                         f"{item} that pins this release's torch and writes `{item}:` under the release")
        else:
            names.append(item)
    others = [abi.value for abi in abis if abi is not default_abi]
    if names and others:
        errors.error(at, f"release {version} builds {', '.join(others)} flavours too, and the index's {names[0]} is "
                     f"built for its default ABI ({default_abi.value if default_abi else '?'}) only",
                     "companion-abi", f"build only the default ABI (abis: [{default_abi.value if default_abi else ''}]"
                     ") to install companions, or drop `companions:` (the constraints still pin them)")
    return tuple(name for name in COMPANIONS if name in names)


def _check_one_nightly(errors: _Collector, releases: list[Release]) -> None:
    nightlies = [release for release in releases if release.channel is Channel.NIGHTLY]
    for extra in nightlies[1:]:
        errors.error(("releases", extra.torch_xla, "channel"),
                     f"release {extra.torch_xla} is a second nightly (releases.{nightlies[0].torch_xla} is one)",
                     "nightly-unique", "nightly tags (`nightly_3.11_tpuvm`) name no version: keep one nightly "
                     "release, the version the dev builds lead up to")


def _python_support(errors: _Collector, keys: KeyPath, value: Any) -> SpecifierSet | None:
    try:
        if not isinstance(value, str) or not PYTHON_SUPPORT.fullmatch(value):
            raise InvalidSpecifier(shown_value(value))
        return SpecifierSet(value)
    except InvalidSpecifier:
        errors.error(keys, f"python_support {shown_value(value)} is not a version range", "schema-type",
                     'write a specifier such as ">=3.10,<3.14"')
        return None


def _check_release_rules(errors: _Collector, keys: KeyPath, version: str, torch: str | None,
                         support: SpecifierSet | None, pythons: tuple[str, ...],
                         accelerators: tuple[Accelerator, ...], libtpu: str | None, settings: dict) -> None:
    if torch and RELEASE_VERSION.fullmatch(version) and minor(torch) != minor(version):
        errors.error(keys + ("torch",), f"torch {torch} does not go with torch_xla {version}", "torch-pin",
                     f"torch_xla {version} is built against torch {minor(version)}.x; pin torch {minor(version)}.*")
    if support is not None and "pythons" in settings:
        for index, python in enumerate(pythons):
            if not support.contains(python + ".0"):
                errors.error(keys + ("pythons", index), f"torch_xla {version} does not support python {python}",
                             "python-supported",
                             f"its python_support is {support}; remove {python} or widen python_support")
    if support is not None and not pythons:
        errors.error(keys, f"release {version} builds no python: none of defaults.pythons is in {support}",
                     "python-supported", "add a supported python to defaults.pythons or list `pythons:`")
    if Accelerator.TPU in accelerators and not libtpu:
        errors.error(keys, f"release {version} builds tpu flavours but pins no libtpu", "libtpu-pin",
                     "add `libtpu: \"X.Y.Z\"` (the version upstream tested the release with), or build cpu only")


def _excludes(errors: _Collector, value: Any) -> list[tuple[KeyPath, dict[str, str]]]:
    if not isinstance(value, list):
        errors.error(("exclude",), "exclude must be a list of mappings", "schema-type",
                     'for example exclude: [{python: "3.9", accelerator: cpu}]')
        return []
    excludes = []
    for index, entry in enumerate(value):
        keys: KeyPath = ("exclude", index)
        if not isinstance(entry, dict) or not entry:
            errors.error(keys, "each exclude is a non-empty mapping such as {python: \"3.9\", accelerator: cpu}",
                         "schema-type")
            continue
        _check_keys(errors, entry, keys, EXCLUDE_KEYS, "exclude")
        normalised = {}
        for key, item in entry.items():
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                errors.error(keys + (key,), f"exclude {key} must be a string, not {shown_value(item)}",
                             "schema-type", 'for example {python: "3.9", accelerator: cpu}')
                continue
            # As written: an unquoted 3.10 is the python "3.10".
            text = errors.doc.text(keys + (key,)) if isinstance(item, (int, float)) else None
            normalised[key] = text or str(item)
        excludes.append((keys, normalised))
    return excludes


# --- expansion --------------------------------------------------------------------------------------------

def _flavours(errors: _Collector, releases: list[Release],
              excludes: list[tuple[KeyPath, dict[str, str]]]) -> list[Flavour]:
    used = [False] * len(excludes)
    flavours = []
    for release in releases:
        for python in release.pythons:
            for accelerator in release.accelerators:
                for abi in release.abis:
                    facts = {"torch_xla": release.torch_xla, "python": python, "abi": abi.value,
                             "accelerator": accelerator.value}
                    hit = _excluded(facts, excludes)
                    if hit is not None:
                        used[hit] = True
                        continue
                    flavours.append(_flavour(errors.doc, release, python, accelerator, abi))
    for (keys, entry), was_used in zip(excludes, used):
        if not was_used:
            errors.error(keys, f"exclude {entry} matches no flavour", "exclude-matches",
                         "fix the values (versions are exact, e.g. torch_xla: \"2.9.0\") or delete the entry")
    return flavours


def _excluded(facts: dict[str, str], excludes: list[tuple[KeyPath, dict[str, str]]]) -> int | None:
    for index, (_, entry) in enumerate(excludes):
        if all(facts.get(key) == value for key, value in entry.items()):
            return index
    return None


def _flavour(doc: yamlsrc.YamlDoc, release: Release, python: str, accelerator: Accelerator, abi: Abi) -> Flavour:
    keys: KeyPath = ("releases", release.torch_xla)
    return Flavour(
        torch_xla=release.torch_xla,
        torch=release.torch,
        python=python,
        abi=abi,
        accelerator=accelerator,
        libtpu=release.libtpu if accelerator is Accelerator.TPU else None,
        release_default_abi=release.default_abi,
        pytorch_git_rev=release.pytorch_git_rev,
        xla_git_rev=release.xla_git_rev,
        declared_at=str(release.declared_at),
        channel=release.channel,
        nightly_base=release.torch_xla if release.channel is Channel.NIGHTLY else "",
        abis_declared_at=doc.loc(keys + ("abis",)),
        channel_declared_at=doc.loc(keys + ("channel",)),
        companion_versions=release.companion_versions,
        companions=release.companions,
    )


def _with_aliases(flavours: list[Flavour], latest_python: str) -> list[Flavour]:
    """`r2.9_3.11_tpuvm` names the newest patch of a minor; `latest`/`latest_cpu` the newest default flavour."""
    import dataclasses

    nightlies = [flavour for flavour in flavours if flavour.is_nightly]
    # Nightlies get their dated tag once a lock pins a night (Flavour.with_nightly), and never `latest`.
    flavours = [flavour for flavour in flavours if not flavour.is_nightly]
    newest_patch: dict[str, Version] = {}
    for flavour in flavours:
        key = flavour.release_minor
        newest_patch[key] = max(newest_patch.get(key, Version(flavour.torch_xla)), Version(flavour.torch_xla))
    newest_release = max((Version(f.torch_xla) for f in flavours), default=None)
    result = []
    for flavour in flavours:
        aliases: list[str] = []
        if Version(flavour.torch_xla) == newest_patch[flavour.release_minor]:
            aliases.append(make_tag_prefix(flavour.release_minor, flavour.python, flavour.accelerator)
                           + abi_suffix(flavour.abi, flavour.release_default_abi))
        if (Version(flavour.torch_xla) == newest_release and flavour.is_default_abi
                and flavour.python == latest_python):
            aliases.append("latest" if flavour.accelerator is Accelerator.TPU else f"latest_{flavour.accelerator}")
        result.append(dataclasses.replace(flavour, aliases=tuple(aliases)))
    return result + nightlies


def _check_unique_tags(errors: _Collector, flavours: list[Flavour]) -> None:
    owner: dict[str, Flavour] = {}
    for flavour in flavours:
        for name in flavour.tags:
            other = owner.get(name)
            if other is not None and other is not flavour:
                errors.error(("releases", flavour.torch_xla), f"tag {name!r} is produced by two flavours "
                             f"({other.declared_at} and {flavour.declared_at})", "unique-tag",
                             "two releases or entries expand to the same flavour; remove the duplicate")
            owner[name] = flavour


def select(flavours: list[AnyFlavour], names: tuple[str, ...] = (), **filters: str | None) -> list[AnyFlavour]:
    """Flavours named by tag or alias (all when none named), then narrowed by property filters."""
    chosen = flavours
    if names:
        by_name = {name: flavour for flavour in flavours for name in flavour.tags}
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise ConfigError(f"unknown flavour(s): {', '.join(unknown)}", rule="flavour-exists",
                              hint="`build.py list` shows every tag and alias")
        seen: dict[str, AnyFlavour] = {}
        for name in names:
            seen.setdefault(by_name[name].tag, by_name[name])
        chosen = list(seen.values())
    return [flavour for flavour in chosen if flavour.matches(**filters)]


