"""Split a flavour's installed wheels into ordered layer trees, decided from the lock's data.

This file runs INSIDE the image build (the `wheels` stage, with the venv's python): standard library only,
plus `pip._vendor.packaging` (pip is in every venv) for requirement markers. It is copied into the build
context as `split_layers.py`; the host imports it for `GROUPS` and `layer_names` (the Dockerfile renders one
`COPY --from=wheels /layers/<name>/ /` per group, in this order).

How the grouping is decided (never by hand per release):
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
from pathlib import Path

# Layer groups, bottom first: (name, index of the root whose closure it takes, which wheels of it).
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
    """The groups a flavour with `root_count` requirement roots has (3 roots: with libtpu)."""
    return [name for name, root, _ in GROUPS if root < root_count]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- inside the image ---------------------------------------------------------------------------------------

def _distributions(site_packages: Path) -> dict[str, "object"]:
    from importlib import metadata

    return {canonical(dist.metadata["Name"]): dist for dist in metadata.distributions(path=[str(site_packages)])}


def _is_pure(dist) -> bool:
    """True for a python-independent wheel: every WHEEL tag reads `py*-none-*`."""
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    return bool(tags) and all(tag.startswith("py") and tag.split("-")[1] == "none" for tag in tags)


# Marker variables that name the interpreter. What only such a marker pulls in (torch 2.9 wants setuptools on
# python >= 3.12) is there for some pythons and not for others, so it cannot be in the layer they all share.
PYTHON_MARKERS = ("python_version", "python_full_version", "implementation_name", "implementation_version",
                  "platform_python_implementation")


def _closure(root: str, dists: dict, locked: set[str], *, python_neutral: bool = False) -> list[str]:
    """Installed distributions `root` requires, transitively (markers evaluated here, in the image).

    `python_neutral`: follow only requirements whose marker names no interpreter variable (PYTHON_MARKERS).
    """
    from pip._vendor.packaging.requirements import Requirement

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
        for text in dists[name].requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                if python_neutral and any(word in str(requirement.marker) for word in PYTHON_MARKERS):
                    continue
                for wanted in ("", *sorted(requirement.extras)):
                    todo.append((canonical(requirement.name), wanted))
    return sorted(seen)


def assign_groups(roots: list[str], dists: dict, locked: set[str]) -> dict[str, list[str]]:
    """Group name -> distribution names, following GROUPS (see the module docstring)."""
    placed: set[str] = set()
    groups: dict[str, list[str]] = {}
    for name, root_index, which in GROUPS:
        if root_index >= len(roots):
            continue
        neutral = which == "pure"  # the shared layer takes only what every python's torch pulls in
        members = [dist for dist in _closure(roots[root_index], dists, locked, python_neutral=neutral)
                   if dist not in placed]
        if which == "pure":
            members = [dist for dist in members if _is_pure(dists[dist])]
        groups[name] = members
        placed.update(members)
    groups[LEFTOVER_GROUP].extend(sorted(dist for dist in locked if dist in dists and dist not in placed))
    groups[LEFTOVER_GROUP].sort()
    missing = sorted(locked - set(dists))
    if missing:
        raise SystemExit(f"split_layers: locked but not installed: {', '.join(missing)}")
    return groups


def _files_of(dist, site_packages: Path) -> list[Path]:
    files = []
    for record in dist.files or []:
        path = Path(os.path.normpath(site_packages / str(record)))
        if path.is_file() or path.is_symlink():
            files.append(path)
    return files


def _move(path: Path, layer: Path) -> int:
    return _move_to(path, layer / path.relative_to("/"))


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


# site-packages/__pycache__ holds the .pyc files of every top-level module, whoever installed it: it stays a
# directory (those .pyc files keep their place, in the python-specific layer), never a symlink.
SHARED_TOPS = frozenset({"__pycache__"})


def _top(path: Path, site_packages: Path) -> str | None:
    """The top-level site-packages entry `path` belongs to (None: outside site-packages, e.g. bin/, or in a
    directory every distribution shares)."""
    try:
        top = path.relative_to(site_packages).parts[0]
    except ValueError:
        return None
    return None if top in SHARED_TOPS else top


def _relocatable(groups: dict[str, list[str]], dists: dict, site_packages: Path) -> set[str]:
    """Distributions of PURE_GROUP whose top-level entries no distribution of another group shares."""
    others = {_top(path, site_packages) for name, members in groups.items() if name != PURE_GROUP
              for dist in members for path in _files_of(dists[dist], site_packages)}
    return {dist for dist in groups.get(PURE_GROUP, [])
            if not ({_top(path, site_packages) for path in _files_of(dists[dist], site_packages)} & others - {None})}


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


def split(site_packages: Path, venv: Path, out: Path, roots: list[str], locked: set[str], baseline: set[str],
          epoch: int) -> dict[str, dict]:
    dists = _distributions(site_packages)
    groups = assign_groups(roots, dists, locked)
    moved = _relocatable(groups, dists, site_packages)
    sizes = {name: 0 for name in layer_names(len(roots))}
    tops: set[str] = set()
    for name in sizes:
        (out / name).mkdir(parents=True, exist_ok=True)
        for dist in groups[name]:
            for path in _files_of(dists[dist], site_packages):
                layer, target = _place(path, site_packages, name, dist in moved)
                if dist in moved and _top(path, site_packages) is not None:
                    tops.add(_top(path, site_packages))
                sizes[layer] += _move_to(path, out / layer / target.relative_to("/"))
    for top in sorted(tops):
        link = out / PURE_EXTRAS_GROUP / site_packages.relative_to("/") / top
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(PURE_DIR) / top)
    report: dict[str, dict] = {}
    for name, size in sizes.items():
        report[name] = {"distributions": groups[name], "bytes": size,
                        "versions": {dist: dists[dist].version for dist in groups[name]}}
    report[PURE_GROUP]["moved_to_" + PURE_DIR] = sorted(moved)
    # What pip wrote that no RECORD lists (there should be nothing): with the leftovers, not lost.
    stray = _new_files(venv, baseline)
    for path in stray:
        report[LEFTOVER_GROUP]["bytes"] += _move(path, out / LEFTOVER_GROUP)
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
    roots = [canonical(re.split(r"[=<>!~ \[;]", root, 1)[0]) for root in args.roots]
    report = split(site_packages, args.venv, args.out, roots, locked, baseline, args.epoch)
    for name, facts in report.items():
        print(f"layer {name}: {facts['bytes'] / 1e6:.1f} MB, {len(facts['distributions'])} wheel(s): "
              f"{' '.join(facts['distributions'])}")
    (args.out / "layers.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
