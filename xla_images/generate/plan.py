"""The plan: site settings + validated flavours + their rendered files + content-addressed ids.

Every command starts here. The id of a flavour hashes everything that goes into its image: the flavour's
facts, its base image and wheel source, its rendered files, its committed lock and the smoke suite. The
build skips a flavour whose image already carries that id.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .. import layers, resources
from ..model import matrix
from ..model.flavour import Flavour
from ..model.site import Site, load_site
from ..names import DOCKERFILES, LOCK_NAME
from ..run import nightly
from ..userfiles import resolve_path
from . import render


@dataclass(frozen=True)
class Plan:
    root: Path
    matrix_path: Path
    site: Site
    flavours: tuple[Flavour, ...]
    # tag -> file name -> content, as `render` writes them under Dockerfiles/<tag>/
    rendered: dict[str, dict[str, str]]

    def flavour_dir(self, flavour: Flavour) -> Path:
        return self.root / DOCKERFILES / flavour.tag

    def lock_path(self, flavour: Flavour) -> Path:
        return self.flavour_dir(flavour) / LOCK_NAME

    @property
    def smoke_dir(self) -> Path:
        """The smoke suite that ships with xla-images (not the project's: a plain install has none)."""
        return resources.smoke_dir()

    def select(self, names: tuple[str, ...] = (), **filters: str | None) -> list[Flavour]:
        return matrix.select(list(self.flavours), names, **filters)


def load_plan(matrix_path: Path, site_path: Path | None = None, overrides: tuple[str, ...] = ()) -> Plan:
    matrix_path = Path(matrix_path)
    root = resolve_path(matrix_path).parent  # a symlink loop is a ConfigError, not a RuntimeError
    site = load_site(site_path, overrides, root=root)
    # A nightly's lock names the night it installs: its versions, dated tag and labels come from there.
    flavours = nightly.pin_from_locks(matrix.load_flavours(matrix_path, site), root)
    rendered = {flavour.tag: render.render_flavour(flavour) for flavour in flavours}
    smoke_digest = _tree_digest(resources.smoke_dir())
    with_ids = tuple(
        dataclasses.replace(
            flavour,
            id=_flavour_id(flavour, rendered[flavour.tag], _read(root / DOCKERFILES / flavour.tag / LOCK_NAME),
                           smoke_digest),
        )
        for flavour in flavours
    )
    return Plan(root, matrix_path, site, with_ids, rendered)


def _flavour_id(flavour: Flavour, files: dict[str, str], lock: str, smoke_digest: str) -> str:
    facts = flavour.to_json()
    facts.pop("id")
    facts["wheel_source"] = flavour.wheel_source.to_json()
    payload = {
        "facts": facts,
        "files": files,
        "lock": lock,
        "smoke": smoke_digest,
        # The wheels stage runs it: a change to how layers are split is a change to the image.
        "split_layers": hashlib.sha256(Path(layers.__file__).read_bytes()).hexdigest(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"sha256:{digest}"


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
    return path.read_text(encoding="utf-8") if path.is_file() else ""
