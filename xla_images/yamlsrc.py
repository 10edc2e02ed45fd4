"""YAML loading that remembers where every value came from, and refuses hostile YAML cheaply.

Validation errors must name the file and line, so we compose PyYAML nodes ourselves and keep, for every
path of keys/indices, the line it starts on and its raw text. The raw text matters for versions: an
unquoted `3.10` is the float 3.1 to YAML, but users mean the python "3.10".

Hostile YAML is refused while the node graph is composed, before any of it is expanded into Python data:
an alias bomb ("billion laughs") is a few hundred bytes of text whose aliases expand to billions of nodes,
so the expanded size of every node is counted as it is composed (an alias adds the size of what it names)
and the document is refused once it passes MAX_NODES. Nesting deeper than MAX_DEPTH (in the text, or
through aliases) and an alias inside the node it names (a cycle) are refused too, so nothing below can
recurse without bound. Rules: yaml-size, yaml-aliases, yaml-depth, yaml-tag, yaml-syntax, yaml-key,
yaml-duplicate-key, yaml-value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import userfiles
from .errors import ConfigError, Location, shorten, shown_value

KeyPath = tuple[str | int, ...]
# Expanded values (scalars, lists, mappings) one document may hold: the committed matrix has ~150, the largest
# sensible one a few thousand. Counted on the composed graph, so a bomb is refused before it is built.
MAX_NODES = 50_000
# Nesting levels: matrix and site files are at most 5 deep. Far below Python's recursion limit.
MAX_DEPTH = 32
# Characters of a number (digits, sign, `0x`, `_`, `:`): schema, level and friends are a few digits. A longer one
# is refused before it is converted: 4,000 hex digits made a number Python cannot even print (its int conversion
# limit raised inside the error message, a traceback, issue 41), and base-60 `1:2:3:...` grows with every part.
MAX_NUMBER_CHARS = 32
_CORE = "tag:yaml.org,2002:"
# The tags plain YAML resolves to. Explicit ones beyond these (!!python/..., !!binary, !!set, !custom) are refused.
ALLOWED_TAGS = frozenset(_CORE + name for name in
                         ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "merge", "value"))


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
    """Parse `path` (at most userfiles.YAML_LIMIT bytes); every problem becomes ConfigError with file and line."""
    shown = str(path)
    if not required and not _exists(path):
        return YamlDoc(shown, {})
    text = userfiles.read_text(path, limit=userfiles.YAML_LIMIT,
                               missing_hint="pass the right path with --matrix / --site, or create the file")
    return loads(text, shown)


def _exists(path: Path) -> bool:
    try:
        path.lstat()
    except (OSError, ValueError):
        return False
    return True


def loads(text: str, shown: str) -> YamlDoc:
    if len(text) > userfiles.YAML_LIMIT:
        raise ConfigError(f"YAML text is larger than {userfiles.YAML_LIMIT // 1024} KiB",
                          location=Location(shown), rule="yaml-size")
    loader = None
    try:
        # The reader rejects control characters already in the constructor, so it belongs in the try.
        loader = _BoundedLoader(text, shown)
        node = loader.get_single_node()
        doc = YamlDoc(shown, None)
        doc.data = {} if node is None else _convert(node, (), doc, loader)
        return doc
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        problem = error.problem or error.context or "invalid YAML"
        raise ConfigError(
            f"YAML syntax error: {shorten(problem)}",
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
        raise ConfigError(f"YAML error: {shorten(str(error))}", location=Location(shown),
                          rule="yaml-syntax") from None
    finally:
        if loader is not None:
            loader.dispose()


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts: expanded size, depth, alias cycles and tags, refused at the mark."""

    def __init__(self, text: str, shown: str) -> None:
        super().__init__(text)
        self.shown = shown
        self.depth = 0
        self.open_anchors: set[str] = set()
        # id(node) -> (expanded size, expanded depth): an alias costs what it names, without building it.
        self.cost: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.open_anchors:
                raise self._refuse(event.start_mark, "yaml-aliases",
                                   f"alias *{shown_value(event.anchor, 40)} refers to a node that contains it "
                                   "(a cycle)", "write the values out; aliases may only name finished nodes")
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._refuse(event.start_mark, "yaml-depth", f"nested deeper than {MAX_DEPTH} levels",
                               "inputs here are a few levels deep; is this the right file?")
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
            self.open_anchors.discard(anchor)
        self._check_tag(node)
        self._count(node)
        return node

    def _check_tag(self, node: yaml.Node) -> None:
        if node.tag not in ALLOWED_TAGS:
            raise self._refuse(node.start_mark, "yaml-tag", f"unsupported YAML tag {shorten(node.tag, 60)}",
                               "remove the tag; these files hold plain strings, numbers, lists and mappings")

    def _count(self, node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            self.cost[id(node)] = (1, 1)
            return
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        costs = [self.cost.get(id(child), (1, 1)) for child in children]
        size = 1 + sum(cost[0] for cost in costs)
        depth = 1 + max((cost[1] for cost in costs), default=0)
        if size > MAX_NODES:
            raise self._refuse(node.start_mark, "yaml-aliases",
                               f"this node expands to more than {MAX_NODES} values (aliases repeat what they name)",
                               "an alias bomb? write the values out, without aliases")
        if depth > MAX_DEPTH:
            raise self._refuse(node.start_mark, "yaml-depth",
                               f"nested deeper than {MAX_DEPTH} levels once aliases are expanded",
                               "write the values out, without aliases")
        self.cost[id(node)] = (size, depth)

    def _refuse(self, mark: yaml.Mark, rule: str, message: str, hint: str) -> ConfigError:
        return ConfigError(message, location=Location(self.shown, mark.line + 1), rule=rule, hint=hint)


def _convert(node: yaml.Node, keys: KeyPath, doc: YamlDoc, loader: yaml.SafeLoader) -> Any:
    doc.lines[keys] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        return _convert_mapping(node, keys, doc, loader)
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, keys + (index,), doc, loader) for index, item in enumerate(node.value)]
    doc.raw[keys] = node.value
    if node.tag == _CORE + "value":  # a lone `=` is YAML 1.1's "value" key; here it is just text
        return node.value
    if node.tag in (_CORE + "int", _CORE + "float") and len(node.value) > MAX_NUMBER_CHARS:
        raise ConfigError(f"a number of {len(node.value)} characters (more than {MAX_NUMBER_CHARS})",
                          location=doc.loc(keys), rule="yaml-value",
                          hint="numbers here are a few digits; quote the value if it is text")
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
