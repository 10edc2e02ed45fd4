"""Turn "cxx11, python 3.11, torch_xla 2.9" into exactly one `HOST/REPO@sha256:...`.

Candidates come from published.json (what `push` verified) or, without one, from the registry itself (the
tags of the plan's flavours that it holds). Exactly one must match the filters: none or several is an error
that lists the candidates and says which filter tells them apart. A published digest is re-checked against
the registry when it answers; when it does not, the recorded digest is still the answer (digests are
immutable), with a warning.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...errors import Failure
from ...model.flavour import Variant, fact, facts_match
from ...model.registry import Registry
from ...model.target import Target
from ...model.published import read_published
from ..registry import RegistryClient

FILTER_OPTIONS = {"abi": "--abi", "python": "--python", "torch_xla": "--torch-xla", "accelerator": "--accelerator",
                  "variant": "--variant"}
Warn = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    tag: str
    ref: str
    facts: dict[str, Any]  # the flavour's `list --json` facts


@dataclass(frozen=True)
class Resolved:
    ref: str
    tag: str
    verified: bool  # False when the registry could not be asked


def with_variant(filters: dict[str, str | None]) -> dict[str, str | None]:
    """A runtime image unless `--variant` says otherwise: a flavour's devel image matches the same facts, and a
    resolve with no variant must still name one image."""
    return filters if "variant" in filters else {**filters, "variant": Variant.RUNTIME.value}


def from_published(path: Path, filters: dict[str, str | None]) -> list[Candidate]:
    entries = read_published(path)
    if not entries:
        raise Failure(f"{path} lists no published flavour", rule="resolve-published",
                      hint="push first (`build.py push TAG`), or resolve from a registry with --registry")
    return [Candidate(entry.tag, entry.ref, entry.flavour) for entry in entries.values()
            if facts_match(entry.flavour, filters)]


def from_registry(flavours: list[Target], client: RegistryClient, filters: dict[str, str | None]) -> list[Candidate]:
    """The plan's flavours matching the filters whose tag the registry serves."""
    found = []
    for flavour in flavours:
        if not flavour.matches(**filters):
            continue
        digest = client.manifest_digest(flavour.tag)
        if digest is not None:
            found.append(Candidate(flavour.tag, client.registry.digest_ref(digest), flavour.to_json()))
    return found


def choose(candidates: list[Candidate], filters: dict[str, str | None], where: str) -> Candidate:
    if len(candidates) == 1:
        return candidates[0]
    given = " ".join(f"{FILTER_OPTIONS[key]} {value}" for key, value in filters.items()
                     if value and not (key == "variant" and value == Variant.RUNTIME.value)) or "(no filters)"
    if not candidates:
        raise Failure(f"no published flavour in {where} matches {given}", rule="resolve-one",
                      hint="loosen the filters, or push the flavour first (`build.py list` shows the tags)")
    listing = "\n    ".join(f"{c.tag}  {c.ref}" for c in sorted(candidates, key=lambda c: c.tag))
    raise Failure(f"{len(candidates)} published flavours in {where} match {given}:\n    {listing}",
                  rule="resolve-one", hint=_telling_filter(candidates, filters))


def _telling_filter(candidates: list[Candidate], filters: dict[str, str | None]) -> str:
    """Name the filters whose values differ among the candidates, with those values."""
    options = []
    for key, option in FILTER_OPTIONS.items():
        if filters.get(key):
            continue
        values = sorted({fact(c.facts, key) for c in candidates})
        if len(values) > 1:
            options.append(f"{option} ({' | '.join(values)})")
    if not options:
        return "the candidates differ only by tag; pick one by its ref"
    return "add " + " or ".join(options)


def verify(candidate: Candidate, client: RegistryClient, warn: Warn) -> Resolved:
    """Check the recorded digest still exists (the registry must answer that very digest); a registry that does
    not answer, or too slowly, only earns a warning."""
    digest = candidate.ref.rpartition("@")[2]
    try:
        present = client.manifest_digest(digest) is not None
    except Failure as error:
        if error.rule not in ("registry-reachable", "registry-dns", "registry-slow"):
            raise  # a TLS or auth failure is a setup to fix, not a registry that is away
        warn(f"warning: could not re-verify {candidate.ref}: {error.message}")
        return Resolved(candidate.ref, candidate.tag, verified=False)
    if not present:
        raise Failure(f"{candidate.ref} ({candidate.tag}) is no longer in the registry", rule="resolve-verified",
                      hint=f"push it again: `build.py push {candidate.tag}`")
    return Resolved(candidate.ref, candidate.tag, verified=True)


def registry_of(entry_ref: str) -> Registry:
    return Registry.parse(entry_ref.rpartition("@")[0], where="published.json")


def resolve_published(path: Path, filters: dict[str, str | None], client_for: Callable[[Registry], RegistryClient],
                      warn: Warn) -> Resolved:
    filters = with_variant(filters)
    candidate = choose(from_published(path, filters), filters, str(path))
    return verify(candidate, client_for(registry_of(candidate.ref)), warn)


def resolve_registry(flavours: list[Target], client: RegistryClient, filters: dict[str, str | None]) -> Resolved:
    client.check_reachable()
    filters = with_variant(filters)
    candidate = choose(from_registry(flavours, client, filters), filters, client.registry.name)
    return Resolved(candidate.ref, candidate.tag, verified=True)

