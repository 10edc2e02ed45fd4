"""The plan: site settings + the matrix's flavours bound to the site (Targets) + their rendered files + ids.

Every command starts here. The id of a target hashes everything that goes into its image (target.content_id):
its facts, base image and wheel source, its rendered files, its committed lock, the smoke suite and the scripts
the wheels stage runs (BUILD_SCRIPTS). The build skips a flavour whose image already carries that id.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from .. import layers, resources, runhome, userfiles, wheel_install
from ..errors import ConfigError, ErrorList
from ..model import matrix, nightly, wheel_index
from ..model.flavour import Variant
from ..model.site import Site, load_site
from ..model.target import Target, bind, content_id
from ..names import DOCKERFILES, HOME_HOOK_SCRIPT, INSTALL_SCRIPT, SPLIT_SCRIPT, lock_file
from ..userfiles import resolve_path
from . import render

# What the wheels stage runs, by its name in the build context -> the module it is a copy of.
BUILD_SCRIPTS: dict[str, Path] = {
    INSTALL_SCRIPT: Path(wheel_install.__file__),
    SPLIT_SCRIPT: Path(layers.__file__),
    HOME_HOOK_SCRIPT: Path(runhome.__file__),
}


def check_tool_sources() -> dict[str, Path]:
    """The sources the image's `xla-images-check` zipapp is made of (run/building/check_tool.py packs them): the imagecheck
    package, the abi package and the two modules of xla_images they import. Found by path, not imported: both
    packages sit above generate. tests/unit/test_imagecheck.py holds this list to the zipapp's members."""
    package = Path(layers.__file__).resolve().parent
    members = {f"xla_images/{name}": package / name for name in ("__init__.py", "errors.py")}
    for sub in ("abi", "imagecheck"):
        members.update({f"xla_images/{sub}/{path.name}": path for path in sorted((package / sub).glob("*.py"))})
    return members


def build_scripts_digest() -> str:
    """sha256 of what the build copies into the image besides the wheels and the smoke suite: the scripts the
    wheels stage runs and the sources of the check tool, names and bytes."""
    digest = hashlib.sha256()
    for name, source in [*sorted(BUILD_SCRIPTS.items()), *sorted(check_tool_sources().items())]:
        data = source.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


@dataclass(frozen=True)
class Plan:
    root: Path
    matrix_path: Path
    site: Site
    # The matrix's flavours as this site builds them, in matrix order: the runtime images, whose files are
    # rendered and locked (render, lock and the layout checks go through these).
    flavours: tuple[Target, ...]
    # runtime tag -> file name -> content, as `render` writes them under Dockerfiles/<tag>/ (a devel image's files
    # are its runtime flavour's: the devel image is a stage of that Dockerfile; see `files`)
    rendered: dict[str, dict[str, str]]

    @property
    def every_image(self) -> tuple[Target, ...]:
        """Every image: each runtime flavour followed by its devel variant (what commands select from: build, test,
        push, resolve, promote, prune, the bake file)."""
        return tuple(image for flavour in self.flavours for image in (flavour, flavour.devel))

    def files(self, flavour: Target) -> dict[str, str]:
        """The rendered files the image is built from: its runtime flavour's."""
        return self.rendered[flavour.runtime_tag]

    def flavour_dir(self, flavour: Target) -> Path:
        """Dockerfiles/<runtime tag>/: a devel flavour's files are its runtime flavour's."""
        return self.root / DOCKERFILES / flavour.runtime_tag

    def lock_path(self, flavour: Target) -> Path:
        return lock_file(self.root, flavour.runtime_tag)

    @property
    def smoke_dir(self) -> Path:
        """The smoke suite that ships with xla-images (not the project's: a plain install has none)."""
        return resources.smoke_dir()

    def select(self, names: tuple[str, ...] = (), **filters: str | None) -> list[Target]:
        """Images named by tag or alias, then filtered. Without names and without a `variant` filter, the
        runtime images only: devel images are asked for (`--variant devel|all`, or by tag)."""
        if not names and "variant" not in filters:
            filters = {**filters, "variant": Variant.RUNTIME.value}
        return matrix.select(list(self.every_image), names, **filters)


def load_plan(matrix_path: Path, site_path: Path | None = None, overrides: tuple[str, ...] = ()) -> Plan:
    matrix_path = Path(matrix_path)
    root = resolve_path(matrix_path).parent  # a symlink loop is a ConfigError, not a RuntimeError
    return plan_for_site(matrix_path, load_site(site_path, overrides, root=root))


def plan_for_site(matrix_path: Path, site: Site) -> Plan:
    """The plan of `matrix_path` with site settings already loaded (a command that rewrote the matrix)."""
    root = resolve_path(matrix_path).parent
    # A nightly's lock names the night it installs: its versions, dated tag and labels come from there.
    # Bound first: a nightly's wheel source is chosen by its release's version, not by the night it pins.
    targets = nightly.pin_from_locks(bind(matrix.load_flavours(matrix_path), site), root)
    check_wheels(targets, wheel_index.load(root / wheel_index.WHEELS_FILE))
    locks = {target.tag: _read(lock_file(root, target.tag)) for target in targets}
    rendered = {target.tag: render.render_flavour(target, locks[target.tag]) for target in targets}
    smoke_digest = _tree_digest(resources.smoke_dir())
    scripts_digest = build_scripts_digest()
    with_ids = tuple(
        dataclasses.replace(
            target, id=content_id(target, rendered[target.tag], locks[target.tag], smoke_digest, scripts_digest))
        for target in targets
    )
    return Plan(root, matrix_path, site, with_ids, rendered)


def check_wheels(targets: tuple[Target, ...] | list[Target], cache: wheel_index.WheelIndex | None) -> None:
    """Every flavour whose wheels come from the cache's index has a wheel of each pin for its python."""
    if cache is None:
        return
    from_index = [target for target in targets
                  if target.wheel_source.wheelhouse is None and not target.wheel_source.torch_xla_local
                  and wheel_index.index_of(target.wheel_source.index_url) == cache.index]
    errors = wheel_index.check(from_index, cache)
    if errors:
        raise ErrorList(errors) if len(errors) > 1 else errors[0]


def _tree_digest(directory: Path) -> str:
    """Hash of every file's relative path and bytes under `directory` (caches excluded)."""
    sha = hashlib.sha256()
    if directory.is_dir():
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                sha.update(str(path.relative_to(directory)).encode() + b"\0")
                sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()


def _read(path: Path) -> str:
    """A lock's text for the id; an absent or unreadable one counts as none (`render --check` reports it)."""
    try:
        return userfiles.read_optional(path, limit=userfiles.LOCK_LIMIT, follow_symlinks=True) or ""
    except ConfigError:
        return ""
