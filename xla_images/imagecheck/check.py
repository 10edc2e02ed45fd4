"""The checks of `xla-images-check`: pinned versions, requirements, one install per distribution, and the imports.

The facts come from the image itself: the constraints file (/opt/xla-images/constraints.txt, the lock's pins,
with the flavour's tag in its header) and XLA_IMAGES_ABI from its environment. Labels are not visible inside a
container, and PIP_CONSTRAINT may have been emptied by a user opting out, so neither is read.

Site-packages is data to this process: it reads metadata (sitedata), asks a `-S -I` child with only pip's
packaging on its path to evaluate requirements (requirements), and lets fresh children of the venv's python do
the importing (loading). The static ABI reader only explains a failed import (explain).
"""
from __future__ import annotations

import importlib.machinery
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from . import explain, loading, requirements, sitedata
from .sitedata import Distribution, canonical, same_version

# Where the image keeps them (xla_images.names has the same paths; this package is standalone: it cannot import it).
CONSTRAINTS = "/opt/xla-images/constraints.txt"
VENV = "/opt/venv"
# The image's own tree: the layer layout keeps python-independent wheels (CUDA libraries, sympy...) under
# /opt/xla-images/any and links them from site-packages (xla_images.layers.PURE_DIR; a unit test ties the two).
# Walks follow those links here, where they are the image's own files; no other link out of the venv.
IMAGE_TREE = "/opt/xla-images"
# The packages that make the flavour: a derived image that changed one of them is another image.
FLAVOUR_PACKAGES = ("torch", "torch-xla", "libtpu")
# The packages built against the flavour's torch (xla_images.model.flavour.COMPANIONS; the constraints pin the one
# built for it): not installed is fine, another version than the pinned one is a problem.
COMPANION_PACKAGES = ("torchvision", "torchaudio")
ABIS = ("cxx11", "pre-cxx11")
RULE_FACTS = "check-facts"
RULE_VENV = "check-venv"
MAX_CONSTRAINTS = 1 << 20
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<op>===|==)\s*(?P<version>[^\s;#]+)\s*(?:#.*)?$")
_FLAVOUR = re.compile(r"^# flavour: (?P<tag>\S+)")


@dataclass(frozen=True)
class Problem:
    kind: str  # "version" | "duplicate" | "requirement" | "import" | "abi"
    message: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message}


@dataclass
class CheckResult:
    tag: str
    venv: str
    site_packages: str
    packages: dict[str, tuple[str, str | None]]  # name -> (pinned, installed)
    problems: list[Problem] = field(default_factory=list)
    torch_abi: str | None = None
    imported: list[str] = field(default_factory=list)  # modules whose import succeeded
    modules_loaded: int = 0  # sys.modules of the import child
    children: int = 0
    not_loaded: list[str] = field(default_factory=list)  # shared objects no import mapped (information)
    not_elf: list[str] = field(default_factory=list)  # `*.so` files that are not ELF (information)
    pth_files: list[str] = field(default_factory=list)  # run by every python start of the venv (information)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def exercised(self) -> str:
        if not self.children:
            return "nothing imported (--no-import)"
        return (f"imported {len(self.imported)} top-level module(s) ({self.modules_loaded} modules in all) in "
                f"{self.children} fresh python(s); their C++ code was loaded, not called")

    def to_json(self) -> dict:
        return {"schema": 2, "ok": self.ok, "tag": self.tag, "venv": self.venv, "site_packages": self.site_packages,
                "packages": {name: {"pinned": pinned, "installed": installed}
                             for name, (pinned, installed) in self.packages.items()},
                "problems": [problem.to_json() for problem in self.problems],
                "imports": {"imported": self.imported, "modules_loaded": self.modules_loaded,
                            "children": self.children, "exercised": self.exercised(), "torch_abi": self.torch_abi},
                "information": {"not_loaded": self.not_loaded, "not_elf": self.not_elf, "pth_files": self.pth_files},
                "seconds": round(self.seconds, 2)}


def read_pins(path: Path) -> tuple[str, dict[str, str]]:
    """(the flavour's tag, {canonical name: pinned version}) of a constraints file; missing, unreadable or
    contradictory facts are a ConfigError (exit 2). `===X` pins are kept as `===X` (compared as text)."""
    try:
        text = sitedata.read_bounded(path, MAX_CONSTRAINTS).decode("utf-8")
    except FileNotFoundError:
        raise _facts_error(f"no constraints file at {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise _facts_error(f"cannot read the constraints file {path}: {error}") from None
    tag, pins = "", {}
    for number, line in enumerate(text.splitlines(), 1):
        flavour = _FLAVOUR.match(line)
        if flavour and not tag:
            tag = flavour.group("tag")
        pin = _PIN.match(line.strip())
        if not pin:
            continue
        name = canonical(pin.group("name"))
        version = ("===" if pin.group("op") == "===" else "") + pin.group("version")
        if name in pins and pins[name] != version:
            raise _facts_error(f"{path}:{number} pins {name} twice ({pins[name]} and {version}): pip can "
                               "satisfy neither")
        pins[name] = version
    if "torch" not in pins:
        raise _facts_error(f"{path} pins no torch: it is not the constraints file of an xla-images image")
    return tag, pins


def _facts_error(message: str) -> ConfigError:
    return ConfigError(message, rule=RULE_FACTS,
                       hint="run it in an xla-images image (or a FROM of one), or pass --constraints and --venv")


def _venv_error(message: str, hint: str = "the image's python environment is /opt/venv; pass --venv for another "
                                          "one") -> ConfigError:
    return ConfigError(message, rule=RULE_VENV, hint=hint)


def site_packages_of(venv: Path, image_tree: Path = Path(IMAGE_TREE)) -> Path:
    """The venv's one site-packages; missing, several, or a link out of the venv is a ConfigError."""
    if not venv.is_dir():
        raise _venv_error(f"no venv at {venv}")
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise _venv_error(f"{venv} holds {len(found)} lib/python3.*/site-packages directories, not one",
                          "pass the venv root (the directory of pyvenv.cfg)")
    if not sitedata.inside(str(found[0]), (os.path.realpath(venv), os.path.realpath(image_tree))):
        raise _venv_error(f"{found[0]} leads out of the venv to {os.path.realpath(found[0])}: that is not the "
                          "venv's site-packages", "site-packages must be a directory of the venv")
    return found[0]


def python_of(venv: Path) -> Path:
    """The venv's python, which must exist and run: another python would answer for another environment."""
    python = venv / "bin" / "python"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        state = "is a dangling link" if python.is_symlink() else "is missing or not executable"
        raise _venv_error(f"{python} {state}: the venv cannot be asked",
                          "recreate the venv (`python3 -m venv`), or pass --venv for the right one")
    return python


def version_problems(pins: dict[str, str], installed: dict[str, str],
                     duplicated: frozenset[str] = frozenset()) -> tuple[dict, list[Problem]]:
    """The flavour packages and companions against their pins (a distribution installed twice is its own
    problem: which of its versions python imports is not known)."""
    packages, problems = {}, []
    for name in FLAVOUR_PACKAGES:
        if name not in pins:
            continue
        pinned, found = pins[name], installed.get(name)
        packages[name] = (pinned.lstrip("="), found)
        if name in duplicated:
            continue
        if found is None:
            problems.append(Problem("version", f"{name} {pinned.lstrip('=')} is no longer installed"))
        elif not _holds(pinned, found):
            problems.append(Problem("version", f"{name} changed {pinned.lstrip('=')} -> {found}"))
    for name in COMPANION_PACKAGES:
        pinned, found = pins.get(name), installed.get(name)
        if pinned and found and name not in duplicated and not _holds(pinned, found):
            packages[name] = (pinned.lstrip("="), found)
            problems.append(Problem("version", f"{name} is {found}, not {pinned.lstrip('=')}, the one built for "
                                               f"torch {pins['torch'].lstrip('=')}"))
    return packages, problems


def _holds(pinned: str, found: str) -> bool:
    """PEP 440 equality for `==` pins (2.9 == 2.9.0), the exact text for `===` ones."""
    if pinned.startswith("==="):
        return pinned[3:] == found
    return same_version(pinned, found)


def duplicates(distributions: list[Distribution]) -> list[Problem]:
    by_key: dict[str, list[Distribution]] = {}
    for distribution in distributions:
        by_key.setdefault(distribution.key, []).append(distribution)
    return [Problem("duplicate", f"{key} is installed {len(found)} times: "
                                 + ", ".join(f"{item.version} ({item.info.name})" for item in found)
                                 + "; which one python imports is an accident of directory order")
            for key, found in by_key.items() if len(found) > 1]


def native_modules(distributions: list[Distribution], site: Path, shared: list[str]) -> list[str]:
    """The top-level modules that hold native code (a package with a shared object under it, or an extension
    module directly in site-packages), of any distribution: theirs are the imports that load it. torch first, then
    packages, then single-file extensions (most are imported by a package before: `_XLAC` by torch_xla). A
    top-level module without native code of its own (torch_xla's optional `torchax`) is not imported."""
    packages: set[str] = set()
    files: set[str] = set()
    for path in shared:
        relative = os.path.relpath(path, site)
        top, _, rest = relative.partition(os.sep)
        if rest and top.isidentifier():
            packages.add(top)
        elif not rest and top.endswith(".so") and top.split(".", 1)[0].isidentifier():
            files.add(top.split(".", 1)[0])
    tops = set()
    for distribution in distributions:
        own = sitedata.top_modules(distribution, site)
        tops.update(own)
        named = distribution.key.replace("-", "_")
        if named in own and any(module in files for module in own):
            packages.add(named)  # torch_xla holds `_XLAC` beside its package: users import the package
    if any(distribution.key == "torch" for distribution in distributions):
        packages.add("torch")
    # `libfoo.so` loose in site-packages is a library (or a linker script), not a module: a single file is imported
    # when a distribution names it, or when its suffix is this python's extension-module suffix.
    suffixes = tuple(suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix != ".so")
    files = {module for module in files if module in tops or any(
        (site / f"{module}{suffix}").exists() for suffix in suffixes)}
    return sorted(packages, key=lambda module: (module != "torch", module)) + sorted(files - packages)


def import_problems(loaded: loading.Loading, site: Path, image_tree: Path) -> list[Problem]:
    """A problem per module that did not import, with the loader's evidence and the static reader's."""
    if loaded.startup:
        return [Problem("import", loaded.startup)]
    failed = [outcome for outcome in loaded.failures() if outcome.status != loading.NOT_RUN]
    problems = []
    evidence = explain.static_evidence(site, [outcome.module for outcome in failed], image_tree) if failed else []
    for outcome in failed:
        how = {loading.FAILED: f"{outcome.error}: {outcome.message}"}.get(outcome.status,
                                                                           f"{outcome.status} ({outcome.error})")
        why = explain.from_message(outcome)
        mine = [line for line in evidence if line.startswith(outcome.module + "/") or
                line.startswith(os.path.join(str(site), outcome.module) + "/")]
        text = f"`import {outcome.module}` {'fails' if outcome.status == loading.FAILED else 'dies'}: {how}"
        problems.append(Problem("import", "; ".join(part for part in (text, why, *mine[:3]) if part)))
    skipped = [outcome.module for outcome in loaded.failures() if outcome.status == loading.NOT_RUN]
    if skipped:
        problems.append(Problem("import", f"not judged, torch does not import: {', '.join(skipped[:8])}"
                                          f"{' ...' if len(skipped) > 8 else ''}"))
    return problems


def _import_step(result: CheckResult, python: Path, distributions: list[Distribution], site: Path,
                 image_tree: Path, expected_abi: str | None, seconds: float) -> None:
    shared, result.not_elf = sitedata.shared_objects(site, str(image_tree))
    modules = native_modules(distributions, site, shared)
    first = "torch" if "torch" in modules else None
    loaded = loading.load_modules(python, modules, first=first, seconds=seconds)
    result.children, result.modules_loaded, result.torch_abi = loaded.children, loaded.modules_loaded, loaded.torch_abi
    result.imported = sorted(name for name, outcome in loaded.outcomes.items() if outcome.status == loading.OK)
    result.not_loaded = [os.path.relpath(path, site) for path in shared
                         if os.path.realpath(path) not in loaded.mapped and path not in result.not_elf]
    result.not_elf = [os.path.relpath(path, site) for path in result.not_elf]
    result.problems += import_problems(loaded, site, image_tree)
    if expected_abi and result.torch_abi and result.torch_abi != expected_abi:
        result.problems.append(Problem("abi", f"torch's libraries use the {result.torch_abi} ABI, the image is "
                                              f"{expected_abi} (XLA_IMAGES_ABI)"))


def check_image(venv: Path, constraints: Path, expected_abi: str | None, *, run_pip: bool = True,
                run_imports: bool = True, image_tree: Path = Path(IMAGE_TREE),
                import_seconds: float = loading.SECONDS) -> CheckResult:
    """Every check; bad input raises ConfigError (exit 2), problems are in the result (exit 1)."""
    started = time.monotonic()
    if expected_abi is not None and expected_abi not in ABIS:
        raise ConfigError(f"the expected ABI {expected_abi!r} is neither of {', '.join(ABIS)}", rule="check-usage",
                          hint="XLA_IMAGES_ABI (or --abi) is cxx11 or pre-cxx11, as the image sets it")
    tag, pins = read_pins(constraints)
    venv = Path(os.path.abspath(venv))  # the children run elsewhere (their own scratch directory)
    site = site_packages_of(venv, image_tree)
    python = python_of(venv)
    distributions = sitedata.find_distributions(site)
    installed: dict[str, str] = {}
    for distribution in distributions:
        installed.setdefault(distribution.key, distribution.version)
    twice = duplicates(distributions)
    packages, problems = version_problems(pins, installed, frozenset(problem.message.split()[0] for problem in twice))
    result = CheckResult(tag, str(venv), str(site), packages, problems + twice)
    result.pth_files = sorted(name for name in os.listdir(site) if name.endswith(".pth"))
    if run_pip:
        result.problems += [Problem("requirement", f"unsatisfied requirement: {line}")
                            for line in requirements.unsatisfied(python, site, distributions)]
    if run_imports:
        _import_step(result, python, distributions, site, image_tree, expected_abi, import_seconds)
    result.seconds = time.monotonic() - started
    return result
