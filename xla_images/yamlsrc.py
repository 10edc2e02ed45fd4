"""YAML loading that remembers where every value came from.

Validation errors must name the file and line, so we compose PyYAML nodes ourselves and keep, for every
path of keys/indices, the line it starts on and its raw text. The raw text matters for versions: an
unquoted `3.10` is the float 3.1 to YAML, but users mean the python "3.10".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, Location

KeyPath = tuple[str | int, ...]


@dataclass
class YamlDoc:
    """Plain data (dicts, lists, scalars) plus the line and raw text of each path in it."""

    path: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    raw: dict[KeyPath, str] = field(default_factory=dict)

    def loc(self, keys: KeyPath) -> Location:
        """The line of `keys`, or of its nearest ancestor that has one."""
        probe = tuple(keys)
        while probe:
            if probe in self.lines:
                return Location(self.path, self.lines[probe])
            probe = probe[:-1]
        return Location(self.path, self.lines.get((), 1))

    def text(self, keys: KeyPath) -> str | None:
        """The scalar at `keys` exactly as written in the file (None for mappings and sequences)."""
        return self.raw.get(tuple(keys))


def load(path: Path, *, required: bool = True) -> YamlDoc:
    """Parse `path`; YAML syntax errors become ConfigError with the file and line."""
    shown = str(path)
    if not path.exists():
        if not required:
            return YamlDoc(shown, {})
        raise ConfigError(
            "file not found",
            location=Location(shown),
            rule="file-exists",
            hint="pass the right path with --matrix / --site, or create the file",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read file: {error}", location=Location(shown), rule="file-readable") from None
    return loads(text, shown)


def loads(text: str, shown: str) -> YamlDoc:
    loader = None
    try:
        # The reader rejects control characters already in the constructor, so it belongs in the try.
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        problem = error.problem or error.context or "invalid YAML"
        raise ConfigError(
            f"YAML syntax error: {problem}",
            location=Location(shown, line),
            rule="yaml-syntax",
            hint="check indentation and quoting on that line",
        ) from None
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        raise ConfigError(
            f"character {error.character!r} is not allowed in YAML", location=Location(shown, line),
            rule="yaml-syntax", hint="remove control characters; save the file as UTF-8",
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"YAML error: {error}", location=Location(shown), rule="yaml-syntax") from None
    finally:
        if loader is not None:
            loader.dispose()
    doc = YamlDoc(shown, None)
    if node is None:
        doc.data = {}
        return doc
    doc.data = _convert(node, (), doc, loader)
    return doc


def _convert(node: yaml.Node, keys: KeyPath, doc: YamlDoc, loader: yaml.SafeLoader) -> Any:
    doc.lines[keys] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        return _convert_mapping(node, keys, doc, loader)
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, keys + (index,), doc, loader) for index, item in enumerate(node.value)]
    doc.raw[keys] = node.value
    try:
        return loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as error:  # e.g. a timestamp like 2024-13-45
        raise ConfigError(
            f"cannot read value: {error}", location=doc.loc(keys), rule="yaml-value"
        ) from None


def _convert_mapping(node: yaml.MappingNode, keys: KeyPath, doc: YamlDoc, loader: yaml.SafeLoader) -> dict:
    result: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(
                "mapping keys must be plain scalars",
                location=Location(doc.path, key_node.start_mark.line + 1),
                rule="yaml-key",
            )
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise ConfigError(
                "YAML merge keys (<<) are not supported",
                location=Location(doc.path, key_node.start_mark.line + 1),
                rule="yaml-key",
                hint="write the keys out, or use the matrix's defaults section",
            )
        # Keys are kept as written: `3.10:` stays "3.10", not the float 3.1.
        key = key_node.value
        if key in result:
            raise ConfigError(
                f"duplicate key {key!r}",
                location=Location(doc.path, key_node.start_mark.line + 1),
                rule="yaml-duplicate-key",
                hint="each key may appear once in a mapping; merge the two entries",
            )
        result[key] = _convert(value_node, keys + (key,), doc, loader)
        doc.lines[keys + (key,)] = key_node.start_mark.line + 1
    return result
