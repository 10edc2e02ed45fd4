"""Refuse a nightly image that is not the night its tag and labels claim, before anything is pushed.

Upstream once shipped a `nightly` image whose torch_xla was weeks old (pytorch/xla#8475). So before a push,
`verify_image` imports torch and torch_xla inside the image and compares their `__version__` and installed
distribution versions with what the labels and the dated tag claim; any difference is a Failure. Which night a
target is comes from its lock (model.nightly pins it there).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ...errors import Failure
from ...model.flavour import dev_date
from ...model.target import Target
from ...names import LABEL_PREFIX
from .. import engine

# Run inside the image: what is really there, imported, not only what pip's metadata says.
PROBE = (
    "import importlib.metadata as m, json\n"
    "import torch, torch_xla\n"
    "print(json.dumps({'torch': torch.__version__, 'torch_xla': torch_xla.__version__,\n"
    "                  'torch_dist': m.version('torch'), 'torch_xla_dist': m.version('torch_xla')}))\n"
)



@dataclass(frozen=True)
class Found:
    """Versions read inside the image: module `__version__` and installed distribution version."""

    torch: str
    torch_xla: str
    torch_dist: str
    torch_xla_dist: str


def mismatches(flavour: Target, labels: dict[str, str], found: Found) -> list[str]:
    """Every way the image's torch/torch_xla differ from its labels and the flavour's dated tag."""
    problems = []
    date = flavour.nightly_date
    claimed = {"torch": labels.get(f"{LABEL_PREFIX}.torch"), "torch_xla": labels.get(f"{LABEL_PREFIX}.torch-xla")}
    label_date = labels.get(f"{LABEL_PREFIX}.nightly-date")
    if label_date != date:
        problems.append(f"label {LABEL_PREFIX}.nightly-date is {label_date!r}, the tag "
                        f"{flavour.nightly_dated_tag} says {date}")
    for module in ("torch", "torch_xla"):
        module_version, dist_version = getattr(found, module), getattr(found, f"{module}_dist")
        want = flavour.pinned_versions[module]
        if claimed[module] != want:
            problems.append(f"label says {module} {claimed[module]}, the lock pins {want}")
        if dist_version != want:
            problems.append(f"installed {module} distribution is {dist_version}, the image claims {want}")
        if _public(module_version) != _public(want):
            problems.append(f"{module}.__version__ is {module_version}, the image claims {want}"
                            + _age(module_version, date))
    return problems


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def _age(version: str, date: str | None) -> str:
    found = dev_date(_public(version))
    if found and date and found < date:
        return f" (a stale build from {found}, older than the claimed {date})"
    return ""


def probe(image: str) -> Found:
    """Import torch and torch_xla in a throw-away container of the image and read their versions."""
    run = engine.containers.run_container(image, ["python", "-c", PROBE], role="nightly-check", timeout=600)
    lines = run.output.strip().splitlines()
    try:
        data = json.loads(lines[-1])
        return Found(str(data["torch"]), str(data["torch_xla"]), str(data["torch_dist"]),
                     str(data["torch_xla_dist"]))
    except (IndexError, ValueError, KeyError):
        tail = "\n  ".join(lines[-10:])
        raise Failure(f"cannot read torch/torch_xla versions in {image} (exit {run.exit_code}):\n  {tail}",
                      rule="nightly-versions", hint="the image must import torch and torch_xla") from None


def verify_image(flavour: Target, image: str) -> None:
    """Refuse a nightly image whose torch/torch_xla are not the night its tag and labels name."""
    if not flavour.is_nightly:
        return
    if flavour.nightly_date is None:
        raise Failure(f"{flavour.tag} is not pinned to a night", rule="nightly-versions",
                      hint=f"lock it first: `./build.py lock {flavour.tag}`, then build it")
    labels = engine.images.image_labels(image) or {}
    problems = mismatches(flavour, labels, probe(image))
    if problems:
        raise Failure(f"{image} is not the nightly {flavour.nightly_dated_tag} it claims to be: "
                      + "; ".join(problems), rule="nightly-versions",
                      hint="the nightly wheel source served a stale build (compare pytorch/xla#8475); nothing was "
                           "pushed. Re-lock when the source has a consistent night, rebuild, test again")
