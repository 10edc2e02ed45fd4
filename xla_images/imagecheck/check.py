"""The checks of `xla-images-check`: pinned versions, `pip check`, the ABI check of the whole venv.

The facts come from the image itself: the constraints file (/opt/xla-images/constraints.txt, the lock's pins,
with the flavour's tag in its header) and XLA_IMAGES_ABI from its environment. Labels are not visible inside a
container, and PIP_CONSTRAINT may have been emptied by a user opting out, so neither is read.
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import abi
from ..errors import ConfigError

# Where the image keeps them (xla_images.names has the same paths; this package is standalone: it cannot import it).
CONSTRAINTS = "/opt/xla-images/constraints.txt"
VENV = "/opt/venv"
# The image's own tree: the layer layout keeps python-independent wheels (CUDA libraries, sympy...) under
# /opt/xla-images/any and links them from site-packages (xla_images.layers.PURE_DIR; a unit test ties the two).
# The ABI walk follows those links here, where they are the image's own files; not on the host.
IMAGE_TREE = "/opt/xla-images"
# The packages that make the flavour: a derived image that changed one of them is another image.
FLAVOUR_PACKAGES = ("torch", "torch-xla", "libtpu")
# The packages built against the flavour's torch (xla_images.model.flavour.COMPANIONS; the constraints pin the one
# built for it): not installed is fine, another version than the pinned one is a problem.
COMPANION_PACKAGES = ("torchvision", "torchaudio")
RULE_FACTS = "check-facts"
RULE_VENV = "check-venv"
RULE_ELF = "check-elf"
PIP_CHECK_SECONDS = 120
MAX_CONSTRAINTS = 1 << 20
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;#]+)\s*$")
_FLAVOUR = re.compile(r"^# flavour: (?P<tag>\S+)")
_CLEAN_PIP_CHECK = "No broken requirements found."


@dataclass(frozen=True)
class Problem:
    kind: str  # "version" | "requirement" | "abi"
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
    abi_verdict: str = ""
    abi_summary: str = ""
    extensions: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"schema": 1, "ok": self.ok, "tag": self.tag, "venv": self.venv, "site_packages": self.site_packages,
                "packages": {name: {"pinned": pinned, "installed": installed}
                             for name, (pinned, installed) in self.packages.items()},
                "problems": [problem.to_json() for problem in self.problems],
                "abi": {"verdict": self.abi_verdict, "summary": self.abi_summary, "extensions": self.extensions},
                "seconds": round(self.seconds, 2)}


def canonical(name: str) -> str:
    """PEP 503 normalisation: `torch_xla`, `Torch.XLA` and `torch-xla` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> tuple[str, dict[str, str]]:
    """(the flavour's tag, {canonical name: pinned version}) of a constraints file; missing or unreadable facts
    are a ConfigError (exit 2)."""
    try:
        if not path.is_file():
            raise _facts_error(f"no constraints file at {path}")
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONSTRAINTS + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise _facts_error(f"cannot read the constraints file {path}: {error}") from None
    if len(data) > MAX_CONSTRAINTS:
        raise _facts_error(f"{path} is larger than any constraints file ({MAX_CONSTRAINTS} bytes)")
    tag, pins = "", {}
    for line in text.splitlines():
        flavour = _FLAVOUR.match(line)
        if flavour and not tag:
            tag = flavour.group("tag")
        pin = _PIN.match(line.strip())
        if pin:
            pins[canonical(pin.group("name"))] = pin.group("version")
    if "torch" not in pins:
        raise _facts_error(f"{path} pins no torch: it is not the constraints file of an xla-images image")
    return tag, pins


def _facts_error(message: str) -> ConfigError:
    return ConfigError(message, rule=RULE_FACTS,
                       hint="run it in an xla-images image (or a FROM of one), or pass --constraints and --venv")


def site_packages_of(venv: Path) -> Path:
    """The venv's one site-packages (or venv itself when it is one); a missing venv is a ConfigError."""
    if not venv.is_dir():
        raise ConfigError(f"no venv at {venv}", rule=RULE_VENV,
                          hint="the image's python environment is /opt/venv; pass --venv for another one")
    if venv.name == "site-packages":
        return venv
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise ConfigError(f"{venv} holds {len(found)} lib/python3.*/site-packages directories, not one",
                          rule=RULE_VENV, hint="pass the venv root (the directory of pyvenv.cfg)")
    return found[0]


def installed_versions(site: Path) -> dict[str, str]:
    """{canonical name: version} of the distributions under site (read from METADATA, nothing imported)."""
    versions: dict[str, str] = {}
    for info in sorted(site.glob("*.dist-info")):
        name = version = None
        try:
            if not stat.S_ISREG((info / "METADATA").stat().st_mode):
                continue  # a fifo would block the open; pip reads no such METADATA either
            with open(info / "METADATA", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.strip():
                        break  # the headers end at the first empty line
                    key, _, value = line.partition(":")
                    if key == "Name":
                        name = value.strip()
                    elif key == "Version":
                        version = value.strip()
        except OSError:
            continue  # a dist-info without METADATA is not installed as far as pip is concerned either
        if name and version:
            versions[canonical(name)] = version
    return versions


def version_problems(pins: dict[str, str], installed: dict[str, str]) -> tuple[dict, list[Problem]]:
    packages, problems = {}, []
    for name in FLAVOUR_PACKAGES:
        if name not in pins:
            continue
        pinned, found = pins[name], installed.get(name)
        packages[name] = (pinned, found)
        if found is None:
            problems.append(Problem("version", f"{name} {pinned} is no longer installed"))
        elif found != pinned:
            problems.append(Problem("version", f"{name} changed {pinned} -> {found}"))
    for name in COMPANION_PACKAGES:
        pinned, found = pins.get(name), installed.get(name)
        if pinned and found and found != pinned:
            packages[name] = (pinned, found)
            problems.append(Problem("version", f"{name} is {found}, not {pinned}, the one built for torch "
                                               f"{pins.get('torch')}"))
    return packages, problems


def pip_check(venv: Path) -> list[Problem]:
    """`pip check` of the venv, one problem per unsatisfied requirement it names."""
    python = venv / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    environment = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        result = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True,
                                timeout=PIP_CHECK_SECONDS, env=environment, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"cannot run `pip check` with {python}: {error}", rule=RULE_VENV,
                          hint="the venv's python and pip must run") from None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode == 0:
        return []
    if not lines or "No module named pip" in result.stderr:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"`pip check` failed to run in {venv} (exit {result.returncode}): {last}",
                          rule=RULE_VENV, hint="the image's venv has pip; reinstall it with `python -m ensurepip`")
    return [Problem("requirement", f"unsatisfied requirement: {line}") for line in lines
            if line != _CLEAN_PIP_CHECK]


def not_elf(site: Path) -> list[str]:
    """Files named like a library or an extension module (`*.so`) that are not ELF: python and the loader fail on
    them, and the ABI check cannot judge them. GNU ld scripts (text `libfoo.so` for the linker) are not modules."""
    found = []
    for directory, _, names in os.walk(site):  # symlinked directories are not followed: no walk out of the venv
        for name in names:
            if not name.endswith(".so"):
                continue
            path = os.path.join(directory, name)
            try:
                if not os.path.isfile(path):
                    continue
                with open(path, "rb") as handle:
                    head = handle.read(64)
            except OSError:
                found.append(path)
                continue
            if not head.startswith(b"\x7fELF") and not head.lstrip().startswith((b"/*", b"INPUT", b"GROUP")):
                found.append(path)
    return found


def abi_problems(report: abi.CheckReport, expected_abi: str | None) -> list[Problem]:
    problems = []
    if expected_abi and report.torch_abi != expected_abi:
        problems.append(Problem("abi", f"torch's libraries use the {report.torch_abi} ABI, the image is "
                                       f"{expected_abi} (XLA_IMAGES_ABI)"))
    for extension in report.extensions:
        if extension.verdict in abi.LOADS:
            continue
        owner = f" ({extension.distribution})" if extension.distribution else ""
        symbol = extension.missing[0] if extension.missing else None
        what = _abi_cause(extension, report.torch_abi)
        detail = f"; missing symbol {symbol.symbol}" if symbol else ""
        more = f" and {len(extension.missing) - 1} more" if len(extension.missing) > 1 else ""
        problems.append(Problem("abi", f"extension {extension.path}{owner} {what}{detail}{more}"))
    return problems


def _abi_cause(extension: abi.ExtensionCheck, torch_abi: str | None) -> str:
    """Why an extension would not load or work, with the evidence the ABI check found (not only its verdict)."""
    if extension.verdict == abi.ABI_MISMATCH:
        return f"built for the other ABI ({extension.abi}, torch is {torch_abi})"
    evidence = (", ".join(extension.libraries_not_found[:2]) or extension.layout_evidence
                or extension.pybind11_evidence)
    return f"{extension.verdict} ({evidence})" if evidence else extension.verdict


def check_image(venv: Path, constraints: Path, expected_abi: str | None, *, run_pip: bool = True,
                image_tree: Path = Path(IMAGE_TREE)) -> CheckResult:
    """Every check; bad input raises ConfigError (exit 2), problems are in the result (exit 1)."""
    started = time.monotonic()
    tag, pins = read_pins(constraints)
    site = site_packages_of(venv)
    packages, problems = version_problems(pins, installed_versions(site))
    if run_pip:
        problems += pip_check(venv)
    unreadable = not_elf(site)
    if unreadable:
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        raise ConfigError(f"{unreadable[0]} is not an ELF shared object{more}: python cannot import it and the ABI "
                          "check cannot judge it", rule=RULE_ELF,
                          hint="reinstall the package that holds it (`pip install --force-reinstall`), or remove it")
    result = CheckResult(tag, str(venv), str(site), packages, problems)
    if abi.has_torch_libraries(site):
        report = abi.check_site_packages(site, also_inside=(image_tree,) if image_tree.is_dir() else ())
        result.problems += abi_problems(report, expected_abi)
        result.abi_verdict, result.abi_summary = report.verdict, report.summary
        result.extensions = len(report.extensions)
    else:
        result.abi_summary = "no torch libraries: nothing to check"
    result.seconds = time.monotonic() - started
    return result
