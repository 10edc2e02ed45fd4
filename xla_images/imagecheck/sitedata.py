"""Site-packages read as data: the installed distributions (dist-info and egg-info, as pip finds them), their
metadata, top-level modules and shared objects. Nothing here imports or runs a file of the venv.

Every read is bounded (a 1.5 GB METADATA without a newline is read in pieces and refused, never held whole), and
every walk stays inside its tree: a link that leads out of it is not followed, except into the image's own tree
(IMAGE_TREE), which the layer layout links site-packages into.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

RULE_METADATA = "check-metadata"
RULE_VENV = "check-venv"
CHUNK = 64 << 10
MAX_HEADERS = 1 << 20  # a METADATA's header block; torch's is ~5 KB
MAX_LIST = 64 << 20  # a RECORD or top_level.txt; torch's RECORD is ~2 MB
MAX_SCAN_FILES = 500_000  # files walked under site-packages before the walk is called a runaway
_PEP440 = re.compile(
    r"^\s*v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>[0-9]+)?)?"
    r"(?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.IGNORECASE)
_PRE = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}


def canonical(name: str) -> str:
    """PEP 503 normalisation: `torch_xla`, `Torch.XLA` and `torch-xla` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(version: str) -> tuple:
    """A key equal for PEP 440-equal versions (`2.9` == `2.9.0`, `1.0RC1` == `1.0rc1`); a version that is not
    PEP 440 is compared as its text, as pip does with `===`."""
    match = _PEP440.match(version)
    if not match:
        return ("legacy", version.strip())
    release = [int(part) for part in match.group("release").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre = (_PRE[match.group("pre_l").lower()], int(match.group("pre_n") or 0)) if match.group("pre_l") else None
    post_number = match.group("post_n1") or match.group("post_n2")
    post = int(post_number or 0) if (match.group("post_l") or match.group("post_n1")) else None
    dev = int(match.group("dev_n") or 0) if match.group("dev_l") else None
    local = tuple(re.split(r"[-_.]", match.group("local").lower())) if match.group("local") else None
    return (int(match.group("epoch") or 0), tuple(release), pre, post, dev, local)


def same_version(one: str, other: str) -> bool:
    return version_key(one) == version_key(other)


@dataclass
class Distribution:
    name: str  # as its metadata spells it
    version: str
    info: Path  # the .dist-info / .egg-info (directory or file)
    kind: str  # "dist-info" | "egg-info"
    requires: list[str] = field(default_factory=list)
    top_level: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # RECORD / installed-files.txt entries, relative to site

    @property
    def key(self) -> str:
        return canonical(self.name)


def read_bounded(path: Path, limit: int, *, stop: bytes | None = None) -> bytes:
    """At most limit bytes of a regular file, read in pieces (stop: end early at this marker). More is an error:
    nothing a package installs legitimately is that large, and holding it whole could exhaust memory."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise OSError("not a regular file")
    pieces, size = [], 0
    with open(path, "rb") as handle:
        while True:
            piece = handle.read(CHUNK)
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)
            size += len(piece)
            if stop is not None and stop in b"".join(pieces[-2:]):
                return b"".join(pieces)
            if size > limit:
                raise OSError(f"larger than {limit} bytes{' before its headers end' if stop else ''}")


def parse_headers(data: bytes) -> dict[str, list[str]]:
    """Email-style headers of a METADATA / PKG-INFO: keys lower-cased (pip reads them case-insensitively), values
    in order; continuation lines join their header; the headers end at the first empty line."""
    headers: dict[str, list[str]] = {}
    last = None
    for raw in data.decode("utf-8", errors="replace").splitlines():
        if not raw.strip():
            break
        if raw[:1] in (" ", "\t") and last is not None:
            headers[last][-1] += " " + raw.strip()
            continue
        key, colon, value = raw.partition(":")
        if not colon:
            continue
        last = key.strip().lower()
        headers.setdefault(last, []).append(value.strip())
    return headers


def _metadata_file(info: Path) -> Path:
    if info.name.endswith(".dist-info"):
        return info / "METADATA"
    return info / "PKG-INFO" if info.is_dir() else info


def _metadata_error(path: Path, error: object) -> ConfigError:
    return ConfigError(f"cannot read {path}: {error}", rule=RULE_METADATA,
                       hint="reinstall the package it belongs to (`pip install --force-reinstall`), or remove it")


def read_distribution(info: Path, site: Path) -> Distribution | None:
    """One installed distribution from its metadata directory (None: pip would not list it either, e.g. a
    dist-info without METADATA). An unreadable or oversized metadata file is a ConfigError (exit 2)."""
    metadata = _metadata_file(info)
    if not metadata.exists() and not metadata.is_symlink():
        return None
    try:
        headers = parse_headers(read_bounded(metadata, MAX_HEADERS, stop=b"\n\n"))
    except OSError as error:
        raise _metadata_error(metadata, error.strerror or error) from None
    stem = info.name.rsplit(".", 1)[0]
    fallback_name, _, fallback_version = stem.partition("-")
    name = (headers.get("name") or [fallback_name])[0]
    version = (headers.get("version") or [fallback_version.split("-")[0]])[0]
    if not name or not version:
        return None
    kind = "dist-info" if info.name.endswith(".dist-info") else "egg-info"
    distribution = Distribution(name, version, info, kind, requires=headers.get("requires-dist", []))
    if kind == "egg-info" and info.is_dir():
        distribution.requires = _egg_requires(info)
    distribution.top_level = [line for line in _list_file(info / "top_level.txt") if _is_module_name(line)]
    distribution.files = _record_files(info, site)
    return distribution


def _list_file(path: Path) -> list[str]:
    """The lines of a RECORD / top_level.txt / requires.txt (absent: none; unreadable or oversized: exit 2)."""
    if not path.exists():
        return []
    try:
        data = read_bounded(path, MAX_LIST)
    except OSError as error:
        raise _metadata_error(path, error.strerror or error) from None
    return [line.strip() for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]


def _egg_requires(info: Path) -> list[str]:
    """requires.txt of an egg-info: unconditional lines until the first `[extra]` section (pip check reads the
    same)."""
    requires = []
    for line in _list_file(info / "requires.txt"):
        if line.startswith("["):
            break
        requires.append(line)
    return requires


def _record_files(info: Path, site: Path) -> list[str]:
    if info.name.endswith(".dist-info"):
        return [line.split(",", 1)[0] for line in _list_file(info / "RECORD")]
    if not info.is_dir():
        return []
    files = []
    for line in _list_file(info / "installed-files.txt"):  # relative to the egg-info
        resolved = os.path.normpath(os.path.join(str(info.relative_to(site)), line))
        files.append(resolved)
    return files


def _is_module_name(name: str) -> bool:
    return name.isidentifier()


def top_modules(distribution: Distribution, site: Path) -> list[str]:
    """The modules `import` can reach for a distribution: top_level.txt, else the first part of each RECORD path
    that is a package or a module directly in site-packages."""
    if distribution.top_level:
        return sorted(set(distribution.top_level))
    found = set()
    for path in distribution.files:
        parts = path.replace("\\", "/").split("/")
        first = parts[0]
        if first in ("..", "") or first.endswith((".dist-info", ".egg-info", ".data")) or first == "__pycache__":
            continue
        if len(parts) > 1 and _is_module_name(first):
            found.add(first)
        elif len(parts) == 1:
            module = first.split(".", 1)[0]
            if first.endswith((".py", ".so")) and _is_module_name(module):
                found.add(module)
    return sorted(found)


def find_distributions(site: Path) -> list[Distribution]:
    """Every distribution pip would list in site: `*.dist-info` and `*.egg-info` (directories, and egg-info
    files), sorted by name."""
    found = []
    try:
        names = sorted(os.listdir(site))
    except OSError as error:
        raise ConfigError(f"cannot list {site}: {error.strerror or error}", rule=RULE_VENV,
                          hint="the venv's site-packages must be readable") from None
    for name in names:
        if name.endswith((".dist-info", ".egg-info")):
            distribution = read_distribution(site / name, site)
            if distribution is not None:
                found.append(distribution)
    return sorted(found, key=lambda distribution: (distribution.key, distribution.info.name))


def inside(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)


def shared_objects(site: Path, image_tree: str) -> tuple[list[str], list[str]]:
    """(every `*.so*` module or library under site, those that are not ELF). Directory links are followed only
    when they stay inside site or lead into the image's own tree; file links likewise."""
    roots = (os.path.realpath(site), os.path.realpath(image_tree))
    found, not_elf, walked = [], [], 0
    stack, seen = [str(site)], set()
    while stack:
        directory = stack.pop()
        real = os.path.realpath(directory)
        if real in seen:
            continue  # a link back to a directory already walked: a cycle, or two names for one tree
        seen.add(real)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            walked += 1
            if walked > MAX_SCAN_FILES:
                raise ConfigError(f"{site} holds more than {MAX_SCAN_FILES} files", rule=RULE_VENV,
                                  hint="site-packages must be the venv's own, not a link to a larger tree")
            if entry.is_symlink() and not inside(entry.path, roots):
                continue  # a link out of the tree: another tree's files are not the venv's
            if entry.is_dir():
                stack.append(entry.path)
            elif (entry.name.endswith(".so") or ".so." in entry.name) and entry.is_file():
                found.append(entry.path)
                if not _looks_elf(entry.path):
                    not_elf.append(entry.path)
    return sorted(found), sorted(not_elf)


def _looks_elf(path: str) -> bool:
    """ELF, or a GNU ld script (the linker's text `libfoo.so`, never loaded at run time)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError:
        return False
    return head.startswith(b"\x7fELF") or head.lstrip().startswith((b"/*", b"INPUT", b"GROUP"))
