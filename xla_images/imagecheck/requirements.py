"""`pip check`'s question, asked without running site-packages: is every installed distribution's Requires-Dist
satisfied by what is installed?

The requirements are read by sitedata (data); only their evaluation needs PEP 508 (markers for the venv's python,
specifiers) — the `packaging` that pip vendors. The checker is standalone and may not import it, so one subprocess
of the venv's python evaluates them, started with `-S -I` (no site: no `.pth` runs, no user site, no PYTHON*
variables) and only pip's own directory on sys.path: it imports pip._vendor.packaging and nothing else of the venv.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import ConfigError
from .sitedata import Distribution

RULE_VENV = "check-venv"
SECONDS = 120
# Runs in the venv's python: reads [[name, version, [requirement...]]...] on stdin, prints one JSON list of
# [name, version, requirement, found-or-null, why] for each requirement it cannot hold as satisfied.
_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import InvalidVersion, Version
dists = json.load(sys.stdin)
installed = {canonicalize_name(name): version for name, version, _ in dists}
out = []
for name, version, requires in dists:
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as error:
            out.append([name, version, text, None, "unparsable: %s" % error])
            continue
        try:
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
        except Exception as error:
            out.append([name, version, text, None, "unparsable marker: %s" % error])
            continue
        found = installed.get(canonicalize_name(req.name))
        if found is None:
            out.append([name, version, text, None, "missing"])
            continue
        try:
            ok = req.specifier.contains(Version(found), prereleases=True)
        except InvalidVersion:
            ok = not req.specifier
        if not ok:
            out.append([name, version, text, found, "conflict"])
print(json.dumps(out))
"""


def pip_directory(site: Path) -> Path:
    """The directory holding the venv's pip (its site-packages, whose other files stay off sys.path)."""
    if not (site / "pip" / "_vendor" / "packaging" / "requirements.py").is_file():
        raise ConfigError(f"{site} has no pip (pip/_vendor/packaging): the requirements cannot be evaluated",
                          rule=RULE_VENV, hint="the image's venv has pip; reinstall it with `python -m ensurepip`")
    return site


def unsatisfied(python: Path, site: Path, distributions: list[Distribution]) -> list[str]:
    """One message per unsatisfied or unparsable requirement, pip check's wording where it has one."""
    directory = pip_directory(site)
    # pip alone on sys.path: a shadow directory holding only a link to it, so no other module of site is found.
    payload = json.dumps([[item.name, item.version, item.requires] for item in distributions])
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    try:
        with tempfile.TemporaryDirectory(prefix="xla-images-check-") as shadow:
            os.symlink(directory / "pip", os.path.join(shadow, "pip"))
            result = subprocess.run([str(python), "-S", "-I", "-c", _SCRIPT, shadow], input=payload,
                                    capture_output=True, text=True, timeout=SECONDS, env=environment, check=False,
                                    cwd=shadow)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"cannot evaluate the requirements with {python}: {error}", rule=RULE_VENV,
                          hint="the venv's python must run") from None
    try:
        findings = json.loads(result.stdout)
    except ValueError:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"{python} could not evaluate the requirements (exit {result.returncode}): {last}",
                          rule=RULE_VENV, hint="the venv's pip must be importable; `python -m ensurepip`") from None
    return [_message(*finding) for finding in findings]


def _message(name: str, version: str, text: str, found: str | None, why: str) -> str:
    if why == "missing":
        return f"{name} {version} requires {text}, which is not installed."
    if why == "conflict":
        return f"{name} {version} has requirement {text}, but you have {found}."
    return f"{name} {version} has a requirement pip cannot read: {text!r} ({why})"
