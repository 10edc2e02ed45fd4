"""What a plain install lacks: the optional extras, and the one-line answer when a dependency is missing.

A plain `pip install xla-images` runs the whole main job (validate … push, resolve, abi, ci, doctor). Features
outside it sit in extras of pyproject.toml (which pins their versions); this module names the modules each extra
provides and what needs them, so a command can say which extra to install instead of ending in a traceback.
tests/unit/test_dependencies.py keeps the two in step. Standard library only: it must work when others are missing.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

from .errors import ConfigError
from .names import DISTRIBUTION


@dataclass(frozen=True)
class Extra:
    name: str
    modules: tuple[str, ...]  # top-level import names its packages provide
    purpose: str  # what needs it, as the user would type it

    def missing(self) -> list[str]:
        return [module for module in self.modules if not _importable(module)]

    @property
    def install(self) -> str:
        return f"pip install '{DISTRIBUTION}[{self.name}]' (in a checkout: pip install -e '.[{self.name}]')"


EXTRAS: dict[str, Extra] = {
    extra.name: extra for extra in (
        Extra("plot", ("matplotlib",), "`bench --plot`"),
    )
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken package, or one blocked with sys.modules[name] = None
        return False


def require(name: str) -> None:
    """Raise a ConfigError (exit 2) naming the extra and its install command unless it is installed."""
    extra = EXTRAS[name]
    missing = extra.missing()
    if missing:
        raise ConfigError(f"{extra.purpose} needs the optional extra '{extra.name}' ({', '.join(missing)} is not "
                          f"installed for {sys.executable})", rule="extra-missing", hint=extra.install)


def missing_dependency_message(error: ModuleNotFoundError) -> str | None:
    """The one-line error for a third-party module that is not installed; None when the module is our own."""
    top = (error.name or "").partition(".")[0]
    if top in ("", __package__):
        return None  # a broken checkout or a bug of ours: the traceback is the useful answer
    for extra in EXTRAS.values():
        if top in extra.modules:
            return ConfigError(f"{extra.purpose} needs the optional extra '{extra.name}'", rule="extra-missing",
                               hint=extra.install).render()
    return ConfigError(f"the dependency {top!r} is not installed for {sys.executable}", rule="dependency-missing",
                       hint=f"install xla-images with its pinned dependencies: pip install {DISTRIBUTION} (in a "
                       "checkout: pip install -e ., or `bash ci/setup.sh` and use .venv/bin/python)").render()
