"""Split a flavour's installed wheels into ordered layer trees, decided from the lock's data.

This file runs INSIDE the image build (the `wheels` stage, with the venv's python): standard library only,
plus `pip._vendor.packaging` (pip is in every venv) for requirement markers. The host runs the same plan and
check on the lock's wheels before any engine work (xla_images/run/packages/layout.py). It is copied into the build
context as `split_layers.py`; the host imports it for `GROUPS` and `layer_names` (the Dockerfile renders one
`COPY --from=wheels /layers/<name>/ /` per group, in this order).

How the grouping is decided (never by hand per release):
  * `venv-bootstrap` (bottom): what the venv's bootstrap installed that the lock does not pin (BOOTSTRAP_GROUP);
  * the roots are the flavour's requirements, in order: torch, torch_xla, then libtpu (tpu flavours);
  * `torch-any`: the dependency closure of torch (Requires-Dist, markers evaluated in the image) restricted to
    python-independent wheels (WHEEL tag `py*-none-*`) that torch needs on every python (reached through no
    marker naming the interpreter): the CUDA/nvidia libraries, sympy, networkx... — the biggest and most
    stable bytes, stored under PURE_DIR (not the python's site-packages), so every flavour whose lock pins the
    same versions (`lock` aligns them across a release's pythons) shares this layer, whatever its python;
  * `torch`: the rest of torch's closure (torch, triton: python-specific wheels; setuptools where only newer
    pythons need it), plus the site-packages symlinks to PURE_DIR and the .pyc files of the moved modules;
  * `torch_xla`: torch_xla's closure minus the above, plus any locked wheel no root reaches;
  * `libtpu`: libtpu's closure minus the above (tpu flavours only), last, so a cpu flavour's layers are a
    prefix of its tpu sibling's.
A torch_xla patch release pinning the same torch therefore rebuilds only the last one or two layers, and the
cpu and tpu flavours of a release share every layer but libtpu's. Each group's size (from the installed files)
is printed and written to /layers/layers.json for the build log.

Reproducible trees: every file, directory and symlink gets mtime SOURCE_DATE_EPOCH; files are moved, never
rewritten; .pyc files were compiled by pip with SOURCE_DATE_EPOCH set (hash-based, no timestamps) and a fixed
PYTHONHASHSEED (set literals marshal in a stable order).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:  # in the image: pip's copy (pip is in every venv); on the host: the project's pinned packaging
    from pip._vendor.packaging.requirements import Requirement
except ImportError:  # pragma: no cover - depends on where it runs
    from packaging.requirements import Requirement

# The bottom layer: what the venv's own bootstrap (ensurepip) installed and the lock does not pin -- pip, and
# setuptools on pythons before 3.12 unless the lock pins its own. The base image's venv is a bare skeleton
# (`venv --without-pip`), and ensurepip runs in the wheels stage before pip installs the lock: a lock that
# upgrades pip or setuptools (torch 2.7/2.8 pin setuptools 82 on every python) replaces them in that one stage,
# so no layer has to delete or change the type of a file a lower layer holds (COPY cannot), and the image's
# venv is file for file what `python -m venv` + `pip install -r requirements.lock` makes.
BOOTSTRAP_GROUP = "venv-bootstrap"
# Layer groups above it, bottom first: (name, index of the root whose closure it takes, which wheels of it).
GROUPS: tuple[tuple[str, int, str], ...] = (
    ("torch-any", 0, "pure"),
    ("torch", 0, "specific"),
    ("torch_xla", 1, "all"),
    ("libtpu", 2, "all"),
)
LAYERS_DIR = "/layers"
# The group that takes locked wheels no root reaches (it exists in every flavour: cpu and tpu agree on it).
LEFTOVER_GROUP = "torch_xla"
# The python-independent group's files live here instead of site-packages (which names the python): the same
# bytes at the same path for every python, so flavours of one release and different pythons share that layer.
# site-packages keeps a symlink per top-level entry (RPATHs like torch's $ORIGIN/../../nvidia/... still resolve,
# and imports, metadata and tracebacks see the usual paths); those symlinks, the python-specific .pyc files
# compiled for the moved modules and the RECORD files naming them go into the next (python-specific) layer.
PURE_DIR = "/opt/xla-images/any"
PURE_GROUP = "torch-any"
PURE_EXTRAS_GROUP = "torch"
# Each layer tree also holds <venv>/MANIFEST_DIR/<group>.json (its wheels and bytes): the image says what is in
# which layer, and no group is ever an empty COPY (the classic builder cannot commit an empty layer).
MANIFEST_DIR = "xla-images-layers"


def layer_names(root_count: int) -> list[str]:
    """The layers a flavour with `root_count` requirement roots has, bottom first (3 roots: with libtpu)."""
    return [BOOTSTRAP_GROUP, *(name for name, root, _ in GROUPS if root < root_count)]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def root_name(requirement: str) -> str:
    """The canonical distribution name a requirement root (`torch==2.9.0`, `torch_xla[tpu]`) names."""
    return canonical(re.split(r"[=<>!~ \[;]", requirement, maxsplit=1)[0])


# --- the plan: pure, the same in the image (installed wheels) and on the host (the lock's wheels) -----------

@dataclass(frozen=True)
class Dist:
    """What the split needs to know of one distribution."""

    name: str  # canonical
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines
    pure: bool  # every WHEEL tag reads `py*-none-*`
    files: tuple[Path, ...]  # absolute paths in the image where pip installs its files (RECORD)


def is_pure_tags(tags: list[str]) -> bool:
    """True for a python-independent wheel: every tag reads `py*-none-*`."""
    return bool(tags) and all(tag.startswith("py") and tag.split("-")[1] == "none" for tag in tags)


# Marker variables that name the interpreter. What only such a marker pulls in (torch 2.9 wants setuptools on
# python >= 3.12) is there for some pythons and not for others, so it cannot be in the layer they all share.
PYTHON_MARKERS = ("python_version", "python_full_version", "implementation_name", "implementation_version",
                  "platform_python_implementation")


def _closure(root: str, dists: dict[str, Dist], locked: set[str], environment: dict[str, str] | None, *,
             python_neutral: bool = False) -> list[str]:
    """Distributions `root` requires, transitively, markers evaluated in `environment` (None: this python's).

    `python_neutral`: follow only requirements whose marker names no interpreter variable (PYTHON_MARKERS).
    """
    seen: list[str] = []
    todo = [(root, "")]
    visited: set[tuple[str, str]] = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in visited or name not in dists or name not in locked:
            continue
        visited.add((name, extra))
        if name not in seen:
            seen.append(name)
        for text in dists[name].requires:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or marker.evaluate({**(environment or {}), "extra": extra}):
                if python_neutral and any(word in str(marker) for word in PYTHON_MARKERS):
                    continue
                for wanted in ("", *sorted(requirement.extras)):
                    todo.append((canonical(requirement.name), wanted))
    return sorted(seen)


def assign_groups(roots: list[str], dists: dict[str, Dist], locked: set[str],
                  environment: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Group name -> distribution names, following GROUPS (see the module docstring).

    What is installed but not locked is the venv's own bootstrap (ensurepip's pip, and setuptools on pythons
    before 3.12 unless the lock pins its own): BOOTSTRAP_GROUP, the bottom layer.
    """
    missing = sorted(locked - set(dists))
    if missing:
        raise LayoutError(f"locked but not installed: {', '.join(missing)}")
    placed: set[str] = set()
    groups: dict[str, list[str]] = {BOOTSTRAP_GROUP: sorted(name for name in dists if name not in locked)}
    for name, root_index, which in GROUPS:
        if root_index >= len(roots):
            continue
        neutral = which == "pure"  # the shared layer takes only what every python's torch pulls in
        members = [dist for dist in _closure(roots[root_index], dists, locked, environment, python_neutral=neutral)
                   if dist not in placed]
        if which == "pure":
            members = [dist for dist in members if dists[dist].pure]
        groups[name] = members
        placed.update(members)
    groups[LEFTOVER_GROUP].extend(sorted(dist for dist in locked if dist not in placed))
    groups[LEFTOVER_GROUP].sort()
    return groups


# site-packages/__pycache__ holds the .pyc files of every top-level module, whoever installed it: it stays a
# directory (those .pyc files keep their place, in the python-specific layer), never a symlink.
SHARED_TOPS = frozenset({"__pycache__"})


def _top(path: Path, site_packages: Path) -> str | None:
    """The top-level site-packages entry `path` belongs to (None: outside site-packages, e.g. bin/, or in a
    directory every distribution shares)."""
    prefix = f"{site_packages}/"
    text = str(path)
    if not text.startswith(prefix):
        return None
    top = text[len(prefix):].split("/", 1)[0]
    return None if top in SHARED_TOPS else top


def _relocatable(groups: dict[str, list[str]], dists: dict[str, Dist], site_packages: Path) -> set[str]:
    """Distributions of PURE_GROUP whose top-level entries no distribution of another group shares."""
    others = {_top(path, site_packages) for name, members in groups.items() if name != PURE_GROUP
              for dist in members for path in dists[dist].files}
    return {dist for dist in groups.get(PURE_GROUP, [])
            if not ({_top(path, site_packages) for path in dists[dist].files} & others - {None})}


def _names_the_python(path: Path) -> bool:
    """A file of a python-independent wheel whose bytes still depend on the python: the .pyc files, and the
    RECORD that lists them (`__pycache__/x.cpython-311.pyc`)."""
    return path.suffix == ".pyc" or (path.name == "RECORD" and path.parent.name.endswith(".dist-info"))


def _place(path: Path, site_packages: Path, group: str, moved: bool) -> tuple[str, Path]:
    """(layer, path in the image) of one installed file (see PURE_DIR)."""
    top = _top(path, site_packages)
    if not moved or top is None:
        return (PURE_EXTRAS_GROUP if moved else group), path
    target = Path(PURE_DIR) / path.relative_to(site_packages)
    return (PURE_EXTRAS_GROUP if _names_the_python(path) else group), target


@dataclass
class Layout:
    """Where every installed file goes: per layer, (installed path, path in the image), and the symlinks."""

    groups: dict[str, list[str]]
    relocated: list[str]
    moves: dict[str, list[tuple[Path, Path]]] = field(default_factory=dict)
    links: list[tuple[Path, Path]] = field(default_factory=list)  # (link in PURE_EXTRAS_GROUP, its target)


def plan(roots: list[str], dists: dict[str, Dist], locked: set[str], site_packages: Path,
         environment: dict[str, str] | None = None) -> Layout:
    """The layout of a flavour's layers: which layer takes each file, at which path. Pure."""
    groups = assign_groups(roots, dists, locked, environment)
    moved = _relocatable(groups, dists, site_packages)
    layout = Layout(groups, sorted(moved), {name: [] for name in layer_names(len(roots))})
    claimed: set[Path] = set()  # a path two wheels install is pip's last write: one file, moved once
    tops: set[str] = set()
    for name in layout.moves:
        for dist in groups[name]:
            for path in dists[dist].files:
                if path in claimed:
                    continue
                claimed.add(path)
                layer, target = _place(path, site_packages, name, dist in moved)
                if dist in moved and _top(path, site_packages) is not None:
                    tops.add(_top(path, site_packages) or "")
                layout.moves[layer].append((path, target))
    layout.links = [(site_packages / top, Path(PURE_DIR) / top) for top in sorted(tops)]
    return layout


FILE, DIRECTORY, SYMLINK = "file", "directory", "symlink"


def check(layout: Layout, base: dict[Path, str]) -> list[str]:
    """Problems that would stop the layers applying cleanly, one line each, naming the path and the layers.

    Each layer is COPY'd over the ones below it: a path that is a file or symlink in one and a directory in
    another (or a file in one and a symlink in another) cannot be applied (`cannot replace to directory ... with
    file`), and the image would not equal a plain install. `base` is what the layers below the first hold
    (the venv skeleton: path -> kind).
    """
    owner: dict[Path, tuple[str, str]] = {}
    problems: list[str] = []

    def claim(path: Path, kind: str, layer: str) -> None:
        parent = path.parent
        while parent != parent.parent:  # up to the first ancestor already known (its own are known too)
            had = owner.get(parent)
            if had is None:
                owner[parent] = (DIRECTORY, layer)
                parent = parent.parent
                continue
            if had[0] != DIRECTORY:
                problems.append(f"{parent}: a {had[0]} in layer {had[1]}, a directory in layer {layer}")
                owner[parent] = (DIRECTORY, layer)
            break
        had = owner.get(path)
        if had is not None and had[0] != kind:
            problems.append(f"{path}: a {had[0]} in layer {had[1]}, a {kind} in layer {layer}")
        elif had is not None and had[1] != layer:
            problems.append(f"{path}: in layer {had[1]} and again in layer {layer} (the upper one would shadow it)")
        owner[path] = (kind, layer)

    for path, kind in sorted(base.items()):
        claim(path, kind, "base")
    for layer, moves in layout.moves.items():
        for _, target in moves:
            claim(target, FILE, layer)
        if layer == PURE_EXTRAS_GROUP:
            for link, _ in layout.links:
                claim(link, SYMLINK, layer)
    return problems


class LayoutError(Exception):
    """The split cannot make layers that apply cleanly (the message names the paths)."""


# --- inside the image ---------------------------------------------------------------------------------------

def installed(site_packages: Path) -> dict[str, Dist]:
    """The distributions installed in `site_packages`, with the files their RECORD lists that exist."""
    from importlib import metadata

    found: dict[str, Dist] = {}
    for dist in metadata.distributions(path=[str(site_packages)]):
        text = dist.read_text("WHEEL") or ""
        tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
        files = []
        for record in dist.files or []:
            path = Path(os.path.normpath(site_packages / str(record)))
            if path.is_file() or path.is_symlink():
                files.append(path)
        name = canonical(dist.metadata["Name"])
        found[name] = Dist(name, dist.version, tuple(dist.requires or ()), is_pure_tags(tags), tuple(files))
    return found


def _move_to(path: Path, target: Path) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    size = path.lstat().st_size
    os.replace(path, target)
    return size


def _normalise(tree: Path, epoch: int) -> None:
    """Every entry's mtime (and atime) = epoch, symlinks themselves included; children before parents."""
    for directory, subdirs, files in os.walk(tree, topdown=False):
        for name in files + subdirs:
            os.utime(os.path.join(directory, name), (epoch, epoch), follow_symlinks=False)
        os.utime(directory, (epoch, epoch), follow_symlinks=False)


def _new_files(venv: Path, baseline: set[str]) -> list[Path]:
    found = []
    for directory, _, files in os.walk(venv):
        for name in files:
            path = Path(directory, name)
            if str(path) not in baseline:
                found.append(path)
    return sorted(found)


def _kind(path: Path) -> str:
    return SYMLINK if path.is_symlink() else DIRECTORY if path.is_dir() else FILE


def split(site_packages: Path, venv: Path, out: Path, roots: list[str], locked: set[str], baseline: set[str],
          epoch: int) -> dict[str, dict]:
    dists = installed(site_packages)
    layout = plan(roots, dists, locked, site_packages)
    base = {Path(path): _kind(Path(path)) for path in baseline}
    problems = check(layout, base)
    if problems:
        raise LayoutError("these paths would not apply cleanly over the layers below them:\n  "
                          + "\n  ".join(problems[:50]))
    sizes = {name: 0 for name in layout.moves}
    for name, moves in layout.moves.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        for path, target in moves:
            sizes[name] += _move_to(path, out / name / target.relative_to("/"))
    for link, target in layout.links:
        link = out / PURE_EXTRAS_GROUP / link.relative_to("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    report: dict[str, dict] = {}
    for name, size in sizes.items():
        members = layout.groups.get(name, [])
        report[name] = {"distributions": members, "bytes": size,
                        "versions": {dist: dists[dist].version for dist in members}}
    report[PURE_GROUP]["moved_to_" + PURE_DIR] = layout.relocated
    # What pip wrote that no RECORD lists (there should be nothing): with the leftovers, not lost.
    stray = _new_files(venv, baseline)
    for path in stray:
        report[LEFTOVER_GROUP]["bytes"] += _move_to(path, out / LEFTOVER_GROUP / path.relative_to("/"))
    report[LEFTOVER_GROUP]["unrecorded_files"] = [str(path) for path in stray]
    for name, facts in report.items():
        manifest = out / name / venv.relative_to("/") / MANIFEST_DIR / f"{name}.json"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"group": name, **facts}, indent=1, sort_keys=True) + "\n")
        _normalise(out / name, epoch)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", required=True, type=Path)
    parser.add_argument("--lock", required=True, type=Path)
    parser.add_argument("--baseline", required=True, type=Path, help="file listing the venv's files before pip")
    parser.add_argument("--out", default=LAYERS_DIR, type=Path)
    parser.add_argument("--epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    parser.add_argument("roots", nargs="+", help="requirement roots in order: torch torch_xla [libtpu]")
    args = parser.parse_args(argv)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = args.venv / "lib" / f"python{version}" / "site-packages"
    locked = {canonical(line.split("==", 1)[0]) for line in args.lock.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    baseline = set(args.baseline.read_text().splitlines())
    roots = [root_name(root) for root in args.roots]
    try:
        report = split(site_packages, args.venv, args.out, roots, locked, baseline, args.epoch)
    except LayoutError as error:
        print(f"split_layers: error: {error}", file=sys.stderr)
        return 1
    for name, facts in report.items():
        print(f"layer {name}: {facts['bytes'] / 1e6:.1f} MB, {len(facts['distributions'])} wheel(s): "
              f"{' '.join(facts['distributions'])}")
    (args.out / "layers.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
