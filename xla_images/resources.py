"""Where the files that ship with xla-images are: the Jinja2 templates, the smoke suite, ci/registry.sh and the
built-in site settings.

The repository keeps them at its top level (templates/, smoke/, examples/extension/). xla_images/templates and xla_images/smoke are
symlinks to those directories (xla_images/ci_scripts to ci/), and pyproject.toml declares them package data, so one lookup inside the package
works for a source checkout (PYTHONPATH), an editable install and an installed wheel (which holds the files
themselves). Nothing here depends on the current directory or on where matrix.yaml is.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import Failure

TEMPLATES = "templates"
CI_TEMPLATES = "templates/ci"
SMOKE_SUITE = "smoke/xla_smoke"
CI_SCRIPTS = "ci_scripts"
SITE_DEFAULTS = "site_defaults.yaml"
EXTENSION_EXAMPLE = "extension_example"


def shipped(relative: str) -> Path:
    """The directory `relative` (e.g. "templates") inside the installed xla_images package."""
    found = resources.files(__package__).joinpath(*relative.split("/"))
    # Rendering and build contexts need real files (Jinja2 loaders, copytree): a zipped install is not supported.
    if not isinstance(found, Path) or not found.is_dir():
        raise Failure(f"{relative}/ is missing from the xla_images package at {resources.files(__package__)}",
                      rule="package-data",
                      hint="reinstall xla-images (`pip install .`); in a checkout, restore the symlinks "
                           "xla_images/templates and xla_images/smoke from version control")
    return found


def site_defaults() -> Path:
    """The built-in site settings (registry, bases, wheel sources) that site.yaml and --set override."""
    return Path(str(resources.files(__package__).joinpath(SITE_DEFAULTS)))


def templates_dir() -> Path:
    return shipped(TEMPLATES)


def ci_templates_dir() -> Path:
    return shipped(CI_TEMPLATES)


def registry_script() -> Path:
    """ci/registry.sh, which runs the local docker-registry (prune stops and restarts it around collection)."""
    return shipped(CI_SCRIPTS) / "registry.sh"


def smoke_dir() -> Path:
    """The smoke suite package (xla_smoke) that every image gets a copy of."""
    return shipped(SMOKE_SUITE)


def extension_example_dir() -> Path:
    """examples/extension: the C++ extension `test` builds in every devel image and runs in its runtime image."""
    # Resolved: in a checkout the name is a symlink, which a copy into a container would keep as a link.
    return shipped(EXTENSION_EXAMPLE).resolve()
