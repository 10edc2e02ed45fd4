"""Site settings: what differs per user (registry, wheel sources, base images, CA bundle).

Three layers, later wins: the built-in defaults (xla_images/site_defaults.yaml), an optional
site.yaml, and `--set key=value` options. Mappings merge key by key; lists and scalars replace.
Which settings exist, which `--set` values are text, and the order they are validated in come from their one
declaration, xla_images/settings.py; each has its validator here, in VALIDATORS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from .. import resources, settings, yamlsrc
from ..errors import ConfigError, ErrorList, Location, XlaImagesError, shorten, shown_value, without_credentials
from .compression import Compression, parse_compression
from .flavour import Abi, Channel
from .registry import EXAMPLE, IMAGE_REFERENCE, MIRROR_EXAMPLE, SHAPE, mirror_problem, registry_problem

TOP_KEYS = set(settings.SITE_KEYS)
SOURCE_KEYS = {"name", "match", "index_url", "extra_index_urls", "find_links", "wheelhouse", "torch_local",
               "torch_xla_local"}
MATCH_KEYS = {"torch_xla", "abi", "channel"}
MAX_SPECIFIER = 200  # characters of a wheel source's torch_xla specifier; a real one is under 30
# Settings land in pip.conf, Dockerfile build arguments and lock headers, one per line: whatever the type,
# no whitespace or control characters (a newline would add a line of its own), and a sane length.
# Whitespace spelled out: Python's \s and a JSON Schema's (ECMAScript) differ (U+FEFF, U+0085), and the schema
# generated from this pattern must refuse exactly what the validator refuses.
_VISIBLE = r"[^\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_PLAIN = re.compile(rf"{_VISIBLE}{{1,2048}}")
# Host paths (ca_bundle, wheelhouse, local find_links) are never written into a config line: spaces are fine.
_PATH = re.compile(r"[^\x00-\x1f\x7f]{1,4096}")
SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
LOCAL_LABEL = re.compile(r"(\+[A-Za-z0-9][A-Za-z0-9.]{0,31})?", re.ASCII)
BASE_PYTHON = re.compile(r"3\.\d{1,3}", re.ASCII)
URL = re.compile(rf"(?:https?|file)://{_VISIBLE}{{1,2040}}")
# A find_links entry: a URL (it lands in pip.conf) or a host folder (it does not).
FIND_LINK = re.compile(rf"{URL.pattern}|(?!.*://){_PATH.pattern}")
DECIMAL = re.compile(r"[-+]?[0-9]+", re.ASCII)
Where = Callable[..., Location]  # a setting's key path -> where it was written (file:line or --set)


@dataclass(frozen=True)
class WheelSource:
    """Where a flavour's wheels come from: pip's default index unless told otherwise."""

    name: str
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    wheelhouse: str | None = None
    # The local version label the source's wheels carry (upstream: `+cxx11` for 2.6 C++11 builds).
    torch_local: str = ""
    torch_xla_local: str = ""

    @property
    def uses_default_index(self) -> bool:
        return self.index_url is None and self.wheelhouse is None

    def to_json(self) -> dict[str, Any]:
        """The source's facts, hashed into lock inputs and flavour ids (image labels): URLs without the credentials
        they may carry, which say nothing about the wheels and must not end up, even hashed, in a label."""
        return {
            "name": self.name,
            "index_url": without_credentials(self.index_url) if self.index_url else self.index_url,
            "extra_index_urls": [without_credentials(url) for url in self.extra_index_urls],
            "find_links": [without_credentials(link) for link in self.find_links],
            "wheelhouse": self.wheelhouse,
            "torch_local": self.torch_local,
            "torch_xla_local": self.torch_xla_local,
        }


@dataclass(frozen=True)
class WheelSourceRule:
    """A wheel source and the flavours it serves."""

    source: WheelSource
    torch_xla: SpecifierSet
    abi: Abi | None
    declared_at: str
    # A source serves tagged releases unless it says `channel: nightly` (the default index has no nightlies).
    channel: Channel = Channel.RELEASE

    def serves(self, torch_xla: str, abi: Abi, channel: Channel = Channel.RELEASE) -> bool:
        if self.abi is not None and self.abi is not abi:
            return False
        if self.channel is not channel:
            return False
        return self.torch_xla.contains(torch_xla, prereleases=True)


@dataclass(frozen=True)
class Site:
    registry: str
    ca_bundle_setting: str
    bases: dict[str, str]
    wheel_sources: tuple[WheelSourceRule, ...]
    # Where the site file lives: relative wheelhouse paths are taken from there.
    root: Path
    # The public key `resolve --verify` / `pull --verify` check signatures with (a path or cosign key URI).
    cosign_public_key_setting: str | None = None
    # How `push` compresses layers (model.compression): zstd by the toolkit, or gzip by the engine.
    compression: Compression = Compression()
    # The zone's pull-through cache `pull` and `resolve` go through (model.registry.Mirror's text), or None.
    pull_mirror: str | None = None
    # The registry repository BuildKit exports and imports build cache through (settings.py), or None.
    build_cache: str | None = None

    def wheel_source_for(self, torch_xla: str, abi: Abi,
                         channel: Channel = Channel.RELEASE) -> WheelSourceRule | None:
        return next((rule for rule in self.wheel_sources if rule.serves(torch_xla, abi, channel)), None)

    def ca_bundle(self) -> Path | None:
        """The CA bundle to inject into builds, or None. `auto` reads pip's and OpenSSL's usual variables."""
        setting = self.ca_bundle_setting
        if setting in ("none", ""):
            return None
        if setting == "auto":
            return settings.read_ca_bundle()
        path = Path(setting)
        if not path.is_absolute():
            path = self.root / path
        if not path.is_file():
            raise ConfigError(
                f"CA bundle {path} does not exist",
                rule="ca-bundle-exists",
                hint="point ca_bundle (site.yaml, --set ca_bundle=FILE or --ca-bundle) at a PEM file, or use `none`",
            )
        return path

    def cosign_public_key(self) -> str | None:
        """The configured public key: a path (relative to the site file) or a cosign URI such as env://VAR."""
        setting = self.cosign_public_key_setting
        if not setting or "://" in setting:
            return setting or None
        path = Path(setting)
        return str(path if path.is_absolute() else self.root / path)

    def wheelhouse_path(self, source: WheelSource) -> Path | None:
        if source.wheelhouse is None:
            return None
        path = Path(source.wheelhouse)
        return path if path.is_absolute() else self.root / path


def load_site(site_path: Path | None, overrides: tuple[str, ...] = (), root: Path | None = None) -> Site:
    """Merge defaults, the site file (if any) and `--set` overrides, then validate."""
    defaults = yamlsrc.load(resources.site_defaults())
    merged: dict[str, Any] = dict(defaults.data)
    origin: dict[str, yamlsrc.YamlDoc] = {key: defaults for key in merged}
    site_root = root or Path.cwd()
    if site_path is not None:
        doc = yamlsrc.load(site_path, required=True)
        _check_top(doc)
        _check_integers(doc)
        merged = _merge(merged, doc.data)
        origin.update({key: doc for key in doc.data})
        site_root = site_path.resolve().parent
    for override in overrides:
        key_path, value = parse_override(override)
        merged = _merge(merged, _nest(key_path, value))
        doc = yamlsrc.YamlDoc(f"--set {shorten(override, 80)}", merged)
        origin[key_path[0]] = doc
    return _build_site(merged, origin, site_root)


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`bases.3.11=img` -> (("bases", "3.11"), "img"). Values are YAML, so lists and mappings work too."""
    where = Location(f"--set {shorten(text, 80)}")
    key, sep, raw_value = text.partition("=")
    if not sep or not key:
        raise ConfigError("expected KEY=VALUE", location=where, rule="set-syntax",
                          hint="for example --set registry=127.0.0.1:5000/xla-images")
    head, _, rest = key.partition(".")
    if head not in TOP_KEYS:
        raise ConfigError(f"unknown site setting {shown_value(head)}", location=where, rule="site-unknown-key",
                          hint=f"known settings: {', '.join(sorted(TOP_KEYS))}")
    value: Any = ""
    if head in settings.SET_TEXT_KEYS or (head == "bases" and rest):
        value = raw_value  # plain strings: `3.11` or `none` must not become a float or null
    elif raw_value.strip():
        try:  # bounded like a file: an alias bomb in --set is refused, not built
            parsed = yamlsrc.loads(raw_value, str(where))
            _check_integers(parsed, where)
            value = parsed.data
        except ConfigError as error:
            if error.rule != "yaml-syntax":
                raise
            value = raw_value  # not YAML: the text itself (validated as a setting below)
    # Only `bases` is keyed by python version, and those keys contain dots: split once.
    return ((head, rest) if rest else (head,)), value


def _check_integers(doc: yamlsrc.YamlDoc, where: Location | None = None) -> None:
    """Refuse an integer not written in decimal: YAML 1.1 reads `0x3`, `0b11`, `1_0` and `3:00` (base 60) as
    numbers, which nobody means in a setting, and a hex one of 4000 digits is an int Python cannot print."""
    for keys, value in _integers(doc.data, ()):
        written = doc.text(keys)
        if written is not None and not DECIMAL.fullmatch(written):
            setting = ".".join(str(key) for key in keys) or "the value"
            raise ConfigError(f"{setting} is {shorten(written, 40)!r}, a YAML 1.1 integer not written in decimal",
                              rule="site-number",
                              location=where or doc.loc(keys),
                              hint="write the number in decimal digits (3, not 0x3), or quote it if it is text")


def _integers(data: Any, keys: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], int]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _integers(value, keys + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _integers(value, keys + (index,))
    elif isinstance(data, int) and not isinstance(data, bool):
        yield keys, data


def _nest(key_path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(key_path):
        value = {key: value}
    return value


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _check_top(doc: yamlsrc.YamlDoc) -> None:
    if not isinstance(doc.data, dict):
        raise ConfigError("a site file is a mapping of settings", location=doc.loc(()), rule="site-schema")
    for key in doc.data:
        if key not in TOP_KEYS:
            raise ConfigError(f"unknown site setting {shown_value(key)}", location=doc.loc((key,)),
                              rule="site-unknown-key",
                              hint=f"known settings: {', '.join(sorted(TOP_KEYS))}")


def _build_site(data: dict[str, Any], origin: dict[str, yamlsrc.YamlDoc], root: Path) -> Site:
    errors: list[XlaImagesError] = []

    def where(key: str, *rest: str | int) -> Location:
        doc = origin.get(key)
        return doc.loc((key, *rest)) if doc else Location("site settings")

    # Each setting's validator, in the declaration's order: every bad setting is reported, in that order.
    values = {setting.name: VALIDATORS[setting.name](data.get(setting.name), where, errors)
              for setting in settings.SITE_SETTINGS}
    if errors:
        raise ErrorList(errors) if len(errors) > 1 else errors[0]
    return Site(
        registry=str(values["registry"]),
        ca_bundle_setting=str(values["ca_bundle"]),
        bases={str(k): str(v) for k, v in values["bases"].items()},
        wheel_sources=tuple(values["wheel_sources"]),
        root=root,
        cosign_public_key_setting=values["cosign_public_key"] or None,
        compression=values["compression"],
        pull_mirror=values["pull_mirror"],
        build_cache=values["build_cache"],
    )


def _registry(registry: Any, where: Where, errors: list[XlaImagesError]) -> Any:
    problem = registry_problem(registry) if isinstance(registry, str) and _PLAIN.fullmatch(registry) else SHAPE
    if problem is not None:
        # The grammar every --registry option is parsed with: a site registry that push would refuse is refused
        # here, when the settings are read.
        detail = "" if problem == SHAPE else f" ({problem})"
        errors.append(ConfigError(f"registry must be HOST[:PORT]/REPOSITORY{detail}", location=where("registry"),
                                  rule="site-registry", hint=f"for example {EXAMPLE}"))
    return registry


def _ca_bundle(ca_setting: Any, where: Where, errors: list[XlaImagesError]) -> Any:
    if ca_setting is None:
        ca_setting = "none"
    if not isinstance(ca_setting, str) or (ca_setting and not _PATH.fullmatch(ca_setting)):
        errors.append(ConfigError("ca_bundle must be a path, `auto` or `none`", location=where("ca_bundle"),
                                  rule="site-ca-bundle", hint="a path without control characters"))
    return ca_setting


def _cosign_public_key(public_key: Any, where: Where, errors: list[XlaImagesError]) -> Any:
    if public_key is not None and (not isinstance(public_key, str) or not _PATH.fullmatch(public_key)):
        errors.append(ConfigError("cosign_public_key must be a path to a cosign public key (or a cosign key URI)",
                                  location=where("cosign_public_key"), rule="site-cosign-public-key"))
    return public_key


def _compression(value: Any, where: Where, errors: list[XlaImagesError]) -> Compression:
    try:
        return parse_compression(value, where("compression"))
    except ConfigError as error:
        errors.append(error)
        return Compression()


def _pull_mirror(value: Any, where_of: Where, errors: list[XlaImagesError]) -> str | None:
    """null or empty (`--set pull_mirror=`): no mirror; else `HOST[:PORT][/PREFIX]` as --mirror takes it."""
    where = where_of("pull_mirror")
    if value is None or value == "":
        return None
    problem = mirror_problem(value) if isinstance(value, str) and _PLAIN.fullmatch(value) else "not a string"
    if problem is not None:
        errors.append(ConfigError(f"pull_mirror must be HOST[:PORT] or HOST[:PORT]/PREFIX ({problem})",
                                  location=where, rule="site-pull-mirror",
                                  hint=f"for example {MIRROR_EXAMPLE}; empty or null for none"))
        return None
    return value.strip()


def _build_cache(value: Any, where_of: Where, errors: list[XlaImagesError]) -> str | None:
    """null or empty: no registry cache; else a repository in the grammar of `registry`."""
    if value is None or value == "":
        return None
    problem = registry_problem(value) if isinstance(value, str) and _PLAIN.fullmatch(value) else SHAPE
    if problem is not None:
        detail = "" if problem == SHAPE else f" ({problem})"
        errors.append(ConfigError(f"build_cache must be HOST[:PORT]/REPOSITORY{detail}",
                                  location=where_of("build_cache"), rule="site-build-cache",
                                  hint=f"for example {EXAMPLE}-cache; empty or null for none"))
        return None
    return value.strip()


def build_cache_refs(repository: str, tag: str, relatives: Iterable[str] = ()) -> tuple[str, ...]:
    """The registry cache refs of flavour `tag` in `repository` (the site's build_cache), one tag per flavour: its
    own first (where its build exports), then its relatives' (flavours whose layers it may share, imported too).
    `build` and the bake override file name the same refs."""
    own = f"{repository}:{tag}"
    return (own, *(f"{repository}:{other}" for other in sorted(set(relatives)) if other != tag))


def build_cache_to(ref: str, compression: Compression | None) -> str:
    """BuildKit's `--cache-to` for `ref`: every stage's layers (mode=max), in the image's own compression when it
    has one, so that a cache layer is the very blob the image pushes (the registry stores it once)."""
    options = ["type=registry", f"ref={ref}", "mode=max", "oci-mediatypes=true"]
    if compression is not None:
        options += [f"compression={compression.format}", "force-compression=true"]
        if compression.level is not None:
            options.append(f"compression-level={compression.level}")
    return ",".join(options)


def _bases(value: Any, where, errors: list[XlaImagesError]) -> dict[str, str]:
    if not isinstance(value, dict):
        errors.append(ConfigError("bases maps a python version to an image reference", location=where("bases"),
                                  rule="site-bases", hint='for example bases: {"3.11": xla-images/base:3.11}'))
        return {}
    good = {}
    for python, image in value.items():
        if not BASE_PYTHON.fullmatch(str(python)):
            errors.append(ConfigError(f"bases key {shown_value(python)} is not a python version like 3.11",
                                      location=where("bases", python), rule="site-bases"))
        elif not isinstance(image, str) or not IMAGE_REFERENCE.fullmatch(image):
            errors.append(ConfigError(f"bases.{python} must be an image reference, not {shown_value(image)}",
                                      location=where("bases", python), rule="site-bases",
                                      hint="for example python:3.11-slim-bookworm: [HOST[:PORT]/]name[:tag]"
                                           "[@digest] as Docker reads it (lowercase name, no spaces or shell)"))
        else:
            good[str(python)] = image
    return good


def _wheel_sources(value: Any, where, errors: list[XlaImagesError]) -> list[WheelSourceRule]:
    if not isinstance(value, list):
        errors.append(ConfigError("wheel_sources must be a list", location=where("wheel_sources"),
                                  rule="site-wheel-sources"))
        return []
    rules = []
    for index, entry in enumerate(value):
        loc = where("wheel_sources", index)
        if not isinstance(entry, dict):
            errors.append(ConfigError("each wheel source is a mapping", location=loc, rule="site-wheel-sources"))
            continue
        unknown = set(entry) - SOURCE_KEYS
        if unknown:
            shown = ", ".join(shown_value(key, 40) for key in sorted(unknown)[:5])
            errors.append(ConfigError(f"unknown wheel source key(s): {shown}", location=loc,
                                      rule="site-unknown-key", hint=f"known keys: {', '.join(sorted(SOURCE_KEYS))}"))
            continue
        before = len(errors)
        _check_source_fields(entry, lambda key: where("wheel_sources", index, key), errors)
        if len(errors) > before:
            continue
        rule = _wheel_source_rule(entry, str(loc), errors)
        if rule is not None and any(other.source.name == rule.source.name for other in rules):
            errors.append(ConfigError(f"two wheel sources are named {rule.source.name}", location=loc,
                                      rule="site-wheel-sources", hint="give each source its own name"))
        elif rule is not None:
            rules.append(rule)
    return rules


def _check_source_fields(entry: dict[str, Any], where, errors: list[XlaImagesError]) -> None:
    """Types and shapes of one wheel source's fields; each lands in pip.conf, a lock header or a pin."""
    def bad(key: str, message: str, hint: str) -> None:
        errors.append(ConfigError(f"{key} {message}, not {shown_value(entry[key])}", location=where(key),
                                  rule="site-wheel-sources", hint=hint))

    if "name" in entry and not (isinstance(entry["name"], str) and SOURCE_NAME.fullmatch(entry["name"])):
        bad("name", "must be a short name (letters, digits, . _ -)", "for example corp-mirror")
    if entry.get("index_url") is not None and not _is_url(entry["index_url"]):
        bad("index_url", "must be an http(s) URL", "for example https://pypi.corp.example/simple")
    for key, fits in (("extra_index_urls", _is_url), ("find_links", _is_link)):
        value = entry.get(key)
        items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
        if value is not None and (items is None or not all(fits(item) for item in items)):
            bad(key, "must be a URL (find_links: or a folder), or a list of them", "for example [https://host/wheels/]")
    if entry.get("wheelhouse") is not None and not (isinstance(entry["wheelhouse"], str)
                                                    and _PATH.fullmatch(entry["wheelhouse"])):
        bad("wheelhouse", "must be a folder path", "for example wheelhouse/built")
    for key in ("torch_local", "torch_xla_local"):
        value = entry.get(key)
        if value is not None and not (isinstance(value, str) and LOCAL_LABEL.fullmatch(value)):
            bad(key, "must be a local version label like +cxx11", 'for example torch_local: "+cxx11"')
    match = entry.get("match")
    if isinstance(match, dict):
        if "torch_xla" in match and not isinstance(match["torch_xla"], str):
            errors.append(ConfigError(f"match.torch_xla must be a quoted specifier, not "
                                      f"{shown_value(match['torch_xla'])}", location=where("match"),
                                      rule="site-wheel-sources", hint='for example ">=2.7" or "==2.6.*"'))


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and bool(URL.fullmatch(value))


def _is_link(value: Any) -> bool:
    return isinstance(value, str) and bool(FIND_LINK.fullmatch(value))


def _wheel_source_rule(entry: dict[str, Any], loc: str, errors: list[XlaImagesError]) -> WheelSourceRule | None:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        errors.append(ConfigError("a wheel source needs a `name`", location=loc, rule="site-wheel-sources"))
        return None
    match = {} if entry.get("match") is None else entry["match"]  # null: every release; 0, "" or [] are no match
    if not isinstance(match, dict) or set(match) - MATCH_KEYS:
        errors.append(ConfigError("`match` takes torch_xla (a specifier), abi and channel", location=loc,
                                  rule="site-wheel-sources"))
        return None
    written = match.get("torch_xla", "")
    if not isinstance(written, str) or len(written) > MAX_SPECIFIER:
        # Refused, never cut: a shortened specifier would match other releases than the one written.
        errors.append(ConfigError(f"torch_xla specifier {shown_value(written)} is not a string of at most "
                                  f"{MAX_SPECIFIER} characters", location=loc, rule="site-wheel-sources",
                                  hint='for example ">=2.7" or "==2.6.*"'))
        return None
    try:
        specifier = SpecifierSet(written)
    except InvalidSpecifier:
        errors.append(ConfigError(f"bad torch_xla specifier {shown_value(match.get('torch_xla'))}", location=loc,
                                  rule="site-wheel-sources", hint='for example ">=2.7" or "==2.6.*"'))
        return None
    abi = match.get("abi")
    if abi is not None and (not isinstance(abi, str) or abi not in {a.value for a in Abi}):
        errors.append(ConfigError(f"unknown abi {shown_value(abi)}", location=loc, rule="site-wheel-sources",
                                  hint=f"use {Abi.CXX11.value} or {Abi.PRE_CXX11.value}"))
        return None
    channel = match.get("channel", Channel.RELEASE.value)
    if not isinstance(channel, str) or channel not in {c.value for c in Channel}:
        errors.append(ConfigError(f"unknown channel {shown_value(channel)}", location=loc, rule="site-wheel-sources",
                                  hint=f"use {Channel.RELEASE.value} (the default) or {Channel.NIGHTLY.value}"))
        return None
    source = WheelSource(
        name=name,
        index_url=entry.get("index_url"),
        extra_index_urls=tuple(_as_list(entry.get("extra_index_urls"))),
        find_links=tuple(_as_list(entry.get("find_links"))),
        wheelhouse=entry.get("wheelhouse"),
        torch_local=str(entry.get("torch_local") or ""),
        torch_xla_local=str(entry.get("torch_xla_local") or ""),
    )
    return WheelSourceRule(source, specifier, Abi(abi) if abi else None, loc, Channel(channel))


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


# One validator per declared site setting (settings.SITE_SETTINGS): value, where, errors -> the value to keep.
VALIDATORS: dict[str, Callable[[Any, Where, list[XlaImagesError]], Any]] = {
    "registry": _registry, "ca_bundle": _ca_bundle, "bases": _bases, "wheel_sources": _wheel_sources,
    "cosign_public_key": _cosign_public_key, "compression": _compression, "pull_mirror": _pull_mirror,
    "build_cache": _build_cache}
if set(VALIDATORS) != settings.SITE_KEYS:  # a setting declared without a validator (or the reverse): said at once
    raise ValueError(f"site validators and settings disagree on {sorted(set(VALIDATORS) ^ settings.SITE_KEYS)}")
