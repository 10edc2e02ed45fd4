"""The architecture holds: the import-linter contracts in pyproject.toml, and the facts that must be written twice.

`lint-imports` checks the layers (cli > run > generate > model > foundation > names), that the cli's command
modules import none of each other (only cli.common), that run's jobs (shipping > checking > building > packages |
registry > netread | engine) and each job's modules keep their order, that only run.engine imports docker, and that the smoke
suite imports nothing of xla_images. A contract that cannot fail proves
nothing, so one test runs the very same contracts over a tiny package shaped like xla_images that breaks them.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from xla_images import abi, names
from xla_images.model import matrix
from xla_images.model.flavour import Abi

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(cwd: Path, *pythonpath: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in pythonpath)}
    command = [sys.executable, "-c", LINT_IMPORTS, "--no-cache"] + (["--config", str(config)] if config else [])
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _contract(contract_id: str) -> dict:
    return next(contract for contract in CONTRACTS["contracts"] if contract["id"] == contract_id)


def test_the_import_contracts_hold() -> None:
    result = lint_imports(ROOT, ROOT, ROOT / "smoke", config=ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(CONTRACTS['contracts'])} kept, 0 broken." in result.stdout


def test_the_contracts_fail_on_a_package_that_breaks_them(tmp_path: Path) -> None:
    """The same contracts over a stand-in xla_images whose model imports run, whose cli imports docker, one of
    whose commands imports another, whose ABI package's reader imports its checker and run, whose run engine
    imports a command, whose run packages import the registry (independent siblings), whose run sub-packages
    each import upward, and whose smoke suite imports xla_images: lint-imports must fail and name each import."""
    package = tmp_path / "xla_images"
    layered = [contract for contract in CONTRACTS["contracts"] if contract["type"] == "layers"]
    packages = {container for contract in layered for container in contract["containers"]}
    packages |= {"xla_images.model", "xla_images.imagecheck", "xla_images.generate"}
    for contract in layered:
        (container,) = contract["containers"]
        for layer in contract["layers"]:
            for name in layer.replace("|", ":").split(":"):
                dotted = f"{container}.{name.strip()}"
                path = tmp_path.joinpath(*dotted.split("."))
                for parent in [path.parent, *path.parent.parents][:dotted.count(".")]:
                    parent.mkdir(parents=True, exist_ok=True)
                    (parent / "__init__.py").touch()
                if dotted in packages:
                    path.mkdir(parents=True, exist_ok=True)
                    (path / "__init__.py").touch()
                else:
                    path.with_suffix(".py").touch()
    (package / "abi" / "elf.py").write_text("from xla_images.abi import check\nfrom xla_images.run.building import build\n")
    (package / "model" / "flavour.py").write_text("from xla_images.run.building import build\n")
    (package / "imagecheck" / "check.py").write_text("import xla_images.names\n")
    (package / "cli" / "common.py").write_text("import docker\n")
    (package / "cli" / "test.py").write_text("from xla_images.cli import sbom\n")
    run = package / "run"
    (run / "engine.py").write_text("from xla_images.run.shipping import publish\n")
    (run / "packages" / "lock.py").write_text("from xla_images.run import registry\n")
    (run / "packages" / "index.py").write_text("from xla_images.run.packages import layout\n")
    (run / "building" / "check_tool.py").write_text("from xla_images.run.building import bake\n")
    (run / "checking" / "checks.py").write_text("from xla_images.run.checking import image_tests\n")
    (run / "shipping" / "zstd_push.py").write_text("from xla_images.run.shipping import sign\n")
    (run / "pipeline" / "order.py").write_text("from xla_images.run.pipeline import runner\n")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "__init__.py").write_text("")
    (tmp_path / "smoke" / "xla_smoke").mkdir(parents=True)
    (tmp_path / "smoke" / "xla_smoke" / "__init__.py").write_text("import xla_images.names\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    result = lint_imports(tmp_path, tmp_path, tmp_path / "smoke", config=tmp_path / "pyproject.toml")
    assert result.returncode == 1, result.stdout + result.stderr
    for broken in ("xla_images.model.flavour -> xla_images.run.building.build", "xla_images.cli.common -> docker",
                   "xla_images.run.engine -> xla_images.run.shipping.publish", "xla_smoke -> xla_images.names",
                   "xla_images.abi.elf -> xla_images.abi.check", "xla_images.abi.elf -> xla_images.run.building.build",
                   "xla_images.cli.test -> xla_images.cli.sbom", "xla_images.imagecheck.check -> xla_images.names",
                   "xla_images.run.packages.lock -> xla_images.run.registry",
                   "xla_images.run.packages.index -> xla_images.run.packages.layout",
                   "xla_images.run.building.check_tool -> xla_images.run.building.bake",
                   "xla_images.run.checking.checks -> xla_images.run.checking.image_tests",
                   "xla_images.run.shipping.zstd_push -> xla_images.run.shipping.sign",
                   "xla_images.run.pipeline.order -> xla_images.run.pipeline.runner"):
        assert broken in result.stdout, result.stdout
    assert f"Contracts: 0 kept, {len(CONTRACTS['contracts'])} broken." in result.stdout


@pytest.mark.parametrize("stray", ["stray.py", "run/stray.py", "run/shipping/stray.py"])
def test_a_module_in_no_layer_breaks_the_layers_contract(tmp_path: Path, stray: str) -> None:
    """exhaustive: a new module (top-level, in run, in one of run's jobs) must be placed in a layer before the
    contracts pass again."""
    shutil.copytree(ROOT / "xla_images", tmp_path / "xla_images",
                    ignore=shutil.ignore_patterns("__pycache__", "smoke", "templates", "ci_scripts"))
    (tmp_path / "xla_images" / stray).write_text("")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    result = lint_imports(tmp_path, tmp_path, ROOT / "smoke", config=tmp_path / "pyproject.toml")
    dotted = "xla_images." + stray.removesuffix(".py").replace("/", ".")
    assert result.returncode == 1 and dotted in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("module", ["names.py", "wheel_install.py"])
def test_leaf_modules_import_only_the_standard_library(module: str) -> None:
    """names is the bottom of the package; wheel_install runs in the image build, where only the venv's python
    and its pip are (layers.py also reads pip's vendored packaging: test_dependencies.IN_IMAGE_ONLY)."""
    tree = ast.parse((ROOT / "xla_images" / module).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]


@pytest.mark.parametrize("module", ["wheel_install.py", "layers.py"])
def test_in_image_scripts_parse_on_the_oldest_python_of_the_matrix(module: str) -> None:
    """They run with the image's python, as old as 3.9 (torch_xla 2.6 flavours)."""
    pythons = {flavour.python for flavour in matrix.load_flavours(ROOT / "matrix.yaml")}
    oldest = min(tuple(int(part) for part in python.split(".")) for python in pythons)
    ast.parse((ROOT / "xla_images" / module).read_text(encoding="utf-8"), feature_version=oldest)


def test_the_standalone_abi_tool_speaks_the_model_s_words() -> None:
    """xla_images.abi runs alone inside wheel builds and images (stdlib + errors), so it keeps its own copies."""
    assert (abi.CXX11, abi.PRE_CXX11) == (Abi.CXX11.value, Abi.PRE_CXX11.value)
    assert abi.SITE_PACKAGES_GLOBS[0] == f"{names.VENV}/lib/python3.*/site-packages"


def test_the_registry_state_layout_is_the_one_ci_registry_sh_writes() -> None:
    """run.shipping.prune finds the registries ci/registry.sh runs by their state files: bash and names.py must agree."""
    script = (ROOT / "ci" / "registry.sh").read_text(encoding="utf-8")
    assert f'STATE_DIR="${{{names.STATE_ENV}:-{names.DEFAULT_STATE}}}"' in script
    assert f'DIR="$STATE_DIR/{names.REGISTRY_STATE_DIR}/$PORT"' in script
    assert f'CONFIG="$DIR/{names.REGISTRY_CONFIG}"' in script
    assert f'PID_FILE="$DIR/{names.REGISTRY_PID_FILE}"' in script


def test_no_test_module_imports_another() -> None:
    """What tests share lives in conftest.py fixtures or a helper module, so running or renaming one test file
    never runs or breaks another's tests."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        offenders += [f"{path.relative_to(ROOT)} imports {module}" for module in sorted(modules)
                      if module.split(".")[-1].startswith("test_") or module.split(".")[-1] == "conftest"]
    assert not offenders, offenders


def test_no_two_test_modules_share_a_name() -> None:
    """The test folders have no __init__.py, so pytest imports each test module by its bare name: a second
    test_build.py in another folder stops the whole run at collection ("import file mismatch")."""
    by_name: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name != "conftest.py"}
    assert not shared, shared


def test_no_product_function_is_only_pass() -> None:
    """A method that does nothing (a Reporter's `line` implemented as `pass` by both displays) says a job is
    done that nobody does: drop it from the protocol instead. Docstring-only bodies count as `pass` too."""
    empty = []
    for path in sorted((ROOT / "xla_images").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = [item for item in node.body
                        if not (isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant))]
                if len(body) == 1 and isinstance(body[0], ast.Pass):
                    empty.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not empty, empty


def test_no_product_function_is_over_60_lines() -> None:
    """The house rule (functions <= 60 lines, from `def` to the end, docstring included): a longer one does several jobs
    (run.packages.lock.lock did, with three nested closures, until its steps became _Locking's methods)."""
    long = []
    for path in sorted((ROOT / "xla_images").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


# The product modules that may read the environment (issue 45: at most 8). Everything else gets its settings as
# arguments, from xla_images/settings.py's read_* functions called at the CLI's edge or by the module that needs
# them. Beside settings: what only the docker/TLS world defines, read by the code that follows those
# conventions, and names.LOCAL_REPOSITORY (read at import; run.building.build tags images with it).
ENVIRONMENT_READERS = {
    "xla_images/settings.py",
    "xla_images/names.py",
    "xla_images/run/engine/connection.py",
    "xla_images/run/registry/credentials.py",
    "xla_images/run/registry/tls.py",
}
# Run inside images without the package (or as the image's own test module): they read their own environment.
IN_IMAGE = ("xla_images/abi/", "xla_images/imagecheck/", "xla_images/runhome.py", "xla_images/layers.py",
            "xla_images/wheel_install.py", "xla_images/run/checking/image_checks/test_image.py")


def _reads_environment(tree: ast.AST) -> bool:
    """os.environ / os.environb / os.getenv used at all, or imported by name from os."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                {alias.name for alias in node.names} & {"environ", "environb", "getenv", "getenvb"}:
            return True
    return False


def test_only_the_allowed_modules_read_the_environment() -> None:
    """A new environment read deep in a module is a setting nobody declared: declare it in settings.py and pass
    it on (docs/architecture.md, "A setting"). The list is exact, so a module that stops reading leaves it too."""
    readers = {str(path.relative_to(ROOT)) for path in sorted((ROOT / "xla_images").rglob("*.py"))
               if not str(path.relative_to(ROOT)).startswith(IN_IMAGE)
               and _reads_environment(ast.parse(path.read_text(encoding="utf-8")))}
    assert readers == ENVIRONMENT_READERS
    assert len(ENVIRONMENT_READERS) <= 8
    assert all((ROOT / place).exists() for place in IN_IMAGE), "an in-image exemption names nothing"


@pytest.mark.parametrize("source, reads", [("import os\nos.environ.get('X')\n", True),
                                           ("import os\nenv = {**os.environ}\n", True),
                                           ("import os\nos.getenv('X')\n", True),
                                           ("from os import environ\n", True),
                                           ("import os\nos.path.join('a', 'b')\n", False),
                                           ("def f(environ):\n    return environ.get('X')\n", False)])
def test_an_environment_read_is_recognised(source: str, reads: bool) -> None:
    assert _reads_environment(ast.parse(source)) is reads
