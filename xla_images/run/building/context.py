"""The build context of one flavour: what `build` (and `ci bake --contexts`) hands the engine.

Contract (`write_context`), for a context directory D:
  D/Dockerfile            the rendered Dockerfile (plan.rendered: what `render` writes, even if the committed
                          copy drifted, which is noted)
  D/requirements.lock     the committed lock, installed with --require-hashes
  D/install_wheels.py     xla_images/wheel_install.py, which the wheels stage runs to install the lock
  D/split_layers.py       xla_images/layers.py, which the wheels stage runs to split the venv into layers
  D/wheelhouse/           the locked wheels found on the host (hard links; `.keep` when none): with all of
                          them pip runs offline
  D/xla_smoke/            the smoke suite
  D/constraints.txt       the rendered constraints (the lock's pins), copied to /opt/xla-images/ in the image
  D/xla-images-check      the in-image check, one executable zipapp (run.building.check_tool), copied to /opt/venv/bin/
  D.secrets/pip.conf      pip settings (index URL, with any credentials), and D.secrets/ca.crt when the site
                          has a CA bundle: BuildKit secrets, beside the context and never in it, mounted for the
                          pip step only. The classic builder (no secret mounts) gets them copied into the wheels
                          stage instead (`prepare_classic_context`), which no runtime layer copies from.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ... import userfiles
from ...errors import ConfigError
from ...generate.plan import BUILD_SCRIPTS, Plan
from ...model.lockfile import read_lock
from ...model.site import WheelSource
from ...model.target import Target
from ...names import (CA_SECRET, CHECK_TOOL, CLASSIC_SECRETS_DIR, CONSTRAINTS_NAME, CONTEXT_WHEELHOUSE, DOCKERFILE,
                      IMAGE_CA, IMAGE_WHEELHOUSE, LOCK_NAME, PIP_SECRET, SECRETS_SUFFIX)
from .check_tool import write_check_tool
from ..packages.wheelhouse import wheel_dirs, wheels_for

KEEP_FILE = ".keep"


def pip_conf(source: WheelSource, ca: bool, wheelhouse: bool, offline: bool = False) -> str:
    """pip.conf for the wheels stage (PIP_CONFIG_FILE=/tmp/pip/pip.conf).

    `wheelhouse`: the context's wheelhouse/ holds wheels (find-links). `offline`: it holds every locked wheel,
    so pip must not ask an index at all (with --require-hashes pip would otherwise prefer the index's copy).
    Local find_links of the source are host paths a container cannot see; their wheels reach the build through
    the wheelhouse instead.
    """
    lines = ["# pip settings of the image build's wheels stage, written by xla-images.", "[global]"]
    if offline:
        lines.append("no-index = true")
    else:
        if source.index_url:
            lines.append(f"index-url = {source.index_url}")
        if source.extra_index_urls:
            lines.append(f"extra-index-url = {' '.join(source.extra_index_urls)}")
    links = [IMAGE_WHEELHOUSE] if wheelhouse else []
    if not offline:
        links += [link for link in source.find_links if "://" in link and not link.startswith("file:")]
    if links:
        lines.append(f"find-links = {' '.join(links)}")
    if ca:
        lines.append(f"cert = {IMAGE_CA}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ContextInputs:
    """What the host contributes to a build context: pip settings, the CA bundle, the locked wheels it holds."""

    pip_conf: str
    ca_bundle: Path | None  # copy to pip/ca.crt (an empty file when None)
    wheels: tuple[Path, ...]  # link or copy into wheelhouse/
    offline: bool


def context_inputs(plan: Plan, flavour: Target, wheelhouse: Path | None = None) -> ContextInputs:
    lock = read_lock(plan.lock_path(flavour))
    found = wheels_for(flavour, lock, wheel_dirs(plan, flavour, wheelhouse))
    offline = bool(lock.entries) and len(found) == len(lock.entries)
    ca = plan.site.ca_bundle()
    return ContextInputs(pip_conf(flavour.wheel_source, ca=ca is not None, wheelhouse=bool(found), offline=offline),
                         ca, tuple(found), offline)


def secrets_dir_for(context: Path) -> Path:
    """The secrets of a context live beside it, never inside: BuildKit reads them from there."""
    return context.with_name(context.name + SECRETS_SUFFIX)


def write_context(plan: Plan, flavour: Target, directory: Path, wheelhouse: Path | None = None) -> list[str]:
    """Write a flavour's build context into `directory` and its secrets beside it, as the module docstring
    says; return notes for the build log."""
    inputs = context_inputs(plan, flavour, wheelhouse)
    notes = []
    dockerfile = plan.rendered[flavour.tag][DOCKERFILE]
    on_disk = plan.flavour_dir(flavour) / DOCKERFILE
    if _committed(on_disk) != dockerfile:
        notes.append(f"warning: {on_disk} differs from what `./build.py render` writes; building the rendered one")
    (directory / DOCKERFILE).write_text(dockerfile, encoding="utf-8")
    shutil.copyfile(plan.lock_path(flavour), directory / LOCK_NAME)
    (directory / CONSTRAINTS_NAME).write_text(plan.rendered[flavour.tag][CONSTRAINTS_NAME], encoding="utf-8")
    write_check_tool(directory / CHECK_TOOL)
    for name, source in BUILD_SCRIPTS.items():
        shutil.copyfile(source, directory / name)
    secrets = secrets_dir_for(directory)
    secrets.mkdir(exist_ok=True)
    (secrets / PIP_SECRET).write_text(inputs.pip_conf, encoding="utf-8")
    if inputs.ca_bundle is not None:
        shutil.copyfile(inputs.ca_bundle, secrets / CA_SECRET)
        notes.append(f"CA bundle: {inputs.ca_bundle} (a BuildKit secret of the pip step only)")
    house = directory / CONTEXT_WHEELHOUSE
    house.mkdir()
    for wheel in inputs.wheels:
        _link_or_copy(wheel, house / wheel.name)
    if not inputs.wheels:
        (house / KEEP_FILE).write_bytes(b"")
    notes.append(f"wheels from the host: {len(inputs.wheels)}" + (" (all: pip works offline)" if inputs.offline
                                                                  else ""))
    shutil.copytree(plan.smoke_dir, directory / "xla_smoke", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return notes


def context_secrets(directory: Path) -> dict[str, Path]:
    """BuildKit `--secret id=...,src=...` of a context written by write_context (the CA only when there is one)."""
    secrets = secrets_dir_for(directory)
    return {path.name: path for path in sorted(secrets.iterdir()) if path.is_file()}


_SECRET_MOUNT = re.compile(r"^(?P<run>RUN )?\s*--mount=type=secret,id=(?P<id>[^,\s]+),target=(?P<target>\S+) \\$")


def classic_dockerfile(text: str) -> str:
    """The Dockerfile for the classic builder: each `RUN --mount=type=secret,id=X,target=T` becomes a COPY of
    xla-secrets/X to T before that RUN (in the wheels stage, which no runtime layer copies from)."""
    out: list[str] = []
    pending: list[str] = []
    for line in text.splitlines():
        found = _SECRET_MOUNT.match(line)
        if found:
            pending.append(f"COPY {CLASSIC_SECRETS_DIR}/{found.group('id')} {found.group('target')}")
            continue
        if pending:
            out.extend(pending)
            out.append("RUN " + line.lstrip())
            pending = []
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def prepare_classic_context(directory: Path) -> None:
    """Turn a BuildKit context into a classic one: secrets copied in (an empty CA when none), Dockerfile rewritten."""
    inside = directory / CLASSIC_SECRETS_DIR
    inside.mkdir(exist_ok=True)
    secrets = context_secrets(directory)
    for name in (PIP_SECRET, CA_SECRET):
        if name in secrets:
            shutil.copyfile(secrets[name], inside / name)
        else:
            (inside / name).write_bytes(b"")
    dockerfile = directory / DOCKERFILE
    dockerfile.write_text(classic_dockerfile(dockerfile.read_text(encoding="utf-8")), encoding="utf-8")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # wheels reach gigabytes: a hard link costs nothing
    except OSError:
        shutil.copyfile(source, target)


def _committed(path: Path) -> str | None:
    """The committed Dockerfile's text, or None when absent or not a bounded UTF-8 file (a fifo, a link...)."""
    try:
        return userfiles.read_optional(path)
    except ConfigError:
        return None
