"""What pip recorded about the installed distributions: which one installed a file (RECORD), the torch release it
pins (METADATA `Requires-Dist: torch==X`), and the installed torch's version.

Metadata is advisory: an unreadable, oversized or garbled RECORD/METADATA only means no distribution is named for
those files (the symbol check does not depend on it).
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from .wheel import MAX_METADATA_BYTES


@dataclass(frozen=True)
class Distribution:
    """An installed distribution (its .dist-info) and the exact torch release its metadata requires."""

    name: str
    version: str
    requires_torch: str | None

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


_TORCH_PIN = re.compile(r"^Requires-Dist:\s*torch\s*\(?\s*===?\s*([0-9][^\s,;)]*)\s*\)?\s*(?:;(.*))?$",
                        re.IGNORECASE | re.MULTILINE)


def installed_torch_version(site: Path) -> str | None:
    """The version in torch-X.dist-info (pip's record of what is installed), None if there is not exactly one."""
    versions = [entry.name[len("torch-"):-len(".dist-info")] for entry in site.glob("torch-*.dist-info")]
    return versions[0] if len(versions) == 1 else None


def distributions_of(site: Path, files: set[str]) -> dict[str, Distribution]:
    """relative path -> the distribution whose RECORD lists it, for the given files under site."""
    owners: dict[str, Distribution] = {}
    for info in sorted(site.glob("*.dist-info")):
        if info.name.startswith("torch-") or not files - owners.keys():
            continue
        record = _small_text(info / "RECORD")
        if not record:
            continue
        listed = {row[0] for row in csv.reader(record.splitlines()) if row} & files
        if not listed:
            continue
        name, _, version = info.name[:-len(".dist-info")].partition("-")
        distribution = Distribution(name, version, _torch_pin(_small_text(info / "METADATA") or ""))
        owners.update((path, distribution) for path in listed)
    return owners


def _small_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_METADATA_BYTES:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _torch_pin(metadata: str) -> str | None:
    """'2.8.0' for `Requires-Dist: torch==2.8.0` (or `torch (==2.8.0)`), unless only for an extra."""
    for match in _TORCH_PIN.finditer(metadata):
        marker = match.group(2) or ""
        if "extra" not in marker:
            return match.group(1)
    return None


def same_release(pin: str, installed: str) -> bool:
    """Does installed satisfy ==pin (PEP 440: a pin without a local label matches any local label)?"""
    if pin.endswith(".*"):
        return installed.split("+")[0] == pin[:-2] or installed.startswith(pin[:-1])
    return installed == pin if "+" in pin else installed.split("+")[0] == pin


def same_minor(pin: str, installed: str) -> bool:
    """Do the two versions name the same X.Y release (2.7.1 and 2.7.0+cpu)?"""
    return pin.split("+")[0].split(".")[:2] == installed.split("+")[0].split(".")[:2]
