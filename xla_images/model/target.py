"""A Target: one flavour bound to this site — where its wheels come from, the image it builds FROM, its id.

matrix.py declares flavours the same for every site. `bind` adds what the site decides and checks the rules that
need the site, with the matrix's file:line like every other matrix rule:

  abi-wheel-source      some wheel source serves the flavour's ABI (C++11 only from 2.7 unless one does)
  nightly-wheel-source  a nightly release needs a site wheel source with `match: {channel: nightly}`

A Target is a Flavour (every matrix fact reads the same), plus the site's wheel source and base image and what
follows from them: the requirement pins (the source's local version labels), and the content-addressed `id`
that the plan fills in once the target's files are rendered (`content_id`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable

from packaging.version import Version

from ..errors import ConfigError, ErrorList, XlaImagesError
from ..names import WHEEL_BUILD_SCRIPT
from .flavour import Abi, Channel, Flavour, default_base_image, nightly_specifier
from .site import Site, WheelSource


@dataclass(frozen=True, kw_only=True)
class Target(Flavour):
    """A flavour as this site builds it. Immutable; `bind` makes them, the plan fills in `id`."""

    wheel_source: WheelSource
    base_image: str
    # The hash of everything that goes into the image (content_id); empty until the plan has rendered the files.
    id: str = ""

    @property
    def devel(self) -> Target:
        """The devel image of this runtime target, with its own id: the runtime's id (which hashes the whole
        Dockerfile, devel stage included) and the devel image's facts (devel_id)."""
        devel = Flavour.devel.fget(self)  # type: ignore[attr-defined]
        if self.is_devel or not self.id:
            return devel
        return dataclasses.replace(devel, id=devel_id(self.id, devel))

    @property
    def layer_requirements(self) -> tuple[str, ...]:
        """The requirements that root the image's layers (torch, torch_xla, libtpu), in order.

        A nightly asks for any dev build of its base release: the lock picks the newest night, and these
        stay the same from night to night, so a lock is stale only when the matrix or site changed.
        """
        source = self.wheel_source
        if self.is_nightly:
            pins = [f"torch{nightly_specifier(self.nightly_base)}",
                    f"torch_xla{nightly_specifier(self.nightly_base)}"]
        else:
            pins = [f"torch=={self.torch}{source.torch_local}",
                    f"torch_xla=={self.torch_xla}{source.torch_xla_local}"]
        if self.libtpu:
            # libtpu is pinned explicitly: the 2.6 `[tpu]` extra wants a nightly from a host we cannot reach.
            pins.append(f"libtpu=={self.libtpu}")
        return tuple(pins)

    @property
    def requirements(self) -> tuple[str, ...]:
        """What the lock resolves: the layer roots, then the companions the flavour installs (never roots: what
        no root reaches goes into the torch_xla layer, xla_images/layers.py)."""
        return self.layer_requirements + tuple(f"{name}=={version}" for name, version in self.installed_companions)

    @property
    def pinned_versions(self) -> dict[str, str]:
        """The exact version of each top-level package the image must hold (what the image checks compare)."""
        source = self.wheel_source
        if self.is_nightly:
            versions = {"torch": self.torch, "torch_xla": self.torch_xla}
        else:
            versions = {"torch": self.torch + source.torch_local, "torch_xla": self.torch_xla + source.torch_xla_local}
        if self.libtpu:
            versions["libtpu"] = self.libtpu
        versions.update(self.installed_companions)
        return versions

    def to_json(self) -> dict[str, Any]:
        """The `list --json` contract: CI and scripts rely on these keys (and published.json records them)."""
        facts = {
            "tag": self.tag,
            "aliases": list(self.aliases),
            "torch_xla": self.torch_xla,
            "torch": self.torch,
            "python": self.python,
            "abi": self.abi.value,
            "accelerator": self.accelerator.value,
            "libtpu": self.libtpu,
            "id": self.id,
            "release": self.release_minor,
            "default_abi": self.is_default_abi,
            "pytorch_git_rev": self.pytorch_git_rev,
            "xla_git_rev": self.xla_git_rev,
            "base_image": self.base_image,
            "wheel_source": self.wheel_source.name,
            "requirements": list(self.requirements),
            "labels": self.labels,
        }
        if self.is_devel:
            # Only devel images carry these keys, so runtime flavours' records read as before.
            facts.update({"variant": self.variant.value, "runtime_tag": self.runtime_tag})
        if self.is_nightly:
            # Only nightlies carry these keys, so release flavours keep their ids (the id hashes these facts).
            facts.update({"channel": self.channel.value, "nightly_base": self.nightly_base,
                          "nightly_date": self.nightly_date})
        return facts


def bind(flavours: Iterable[Flavour], site: Site) -> list[Target]:
    """Each flavour bound to the site's first wheel source that serves it and its python's base image.

    Raises ConfigError (one) or ErrorList (several) for flavours no wheel source serves, at the matrix line
    the fix goes on; a flavour that cannot be bound is never returned half-bound.
    """
    targets: list[Target] = []
    errors: list[XlaImagesError] = []
    for flavour in flavours:
        # The release's own version: a nightly's versions are pinned from its lock only after binding.
        rule = site.wheel_source_for(flavour.torch_xla, flavour.abi, flavour.channel)
        if rule is None:
            errors.append(_no_wheel_source(flavour))
            continue
        base = site.bases.get(flavour.python) or default_base_image(flavour.python)
        facts = {field.name: getattr(flavour, field.name) for field in dataclasses.fields(Flavour)}
        targets.append(Target(**facts, wheel_source=rule.source, base_image=base))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ErrorList(errors)
    return targets


def _no_wheel_source(flavour: Flavour) -> ConfigError:
    version, abi = flavour.torch_xla, flavour.abi
    if flavour.channel is Channel.NIGHTLY:
        return ConfigError(f"no configured wheel source serves nightly {abi.title} builds of torch_xla {version} "
                           "(PyPI has no torch_xla nightlies)", location=flavour.channel_declared_at,
                           rule="nightly-wheel-source",
                           hint="add a site.yaml wheel_sources entry with match {channel: nightly"
                                f", abi: {abi.value}}} and a find_links, index_url or wheelhouse holding "
                                f"torch/torch_xla {version}.devYYYYMMDD wheels")
    cxx11_only = abi is Abi.PRE_CXX11 and Version(version) >= Version("2.7")
    why = (f"torch_xla {version} is published C++11-only from 2.7"
           if cxx11_only else f"no configured wheel source serves {abi.title} torch_xla {version}")
    return ConfigError(f"{why}; no wheel source provides {abi.title} wheels for it",
                       location=flavour.abis_declared_at, rule="abi-wheel-source",
                       hint=f"remove {abi.value} from releases.{version}.abis, or add a site.yaml wheel_sources "
                            f"entry with match {{torch_xla: \"=={version}\", abi: {abi.value}}} pointing at "
                            f"wheels of that ABI (e.g. a wheelhouse filled by {WHEEL_BUILD_SCRIPT})")


def content_id(target: Target, files: dict[str, str], lock: str, smoke_digest: str, scripts_digest: str) -> str:
    """`sha256:…` of everything that goes into the target's image: its facts (with the whole wheel source), its
    rendered files, its committed lock, the smoke suite and the scripts the wheels stage runs. Equal ids, equal
    images: `build` skips a flavour whose image already carries its id."""
    facts = target.to_json()
    facts.pop("id")
    facts["wheel_source"] = target.wheel_source.to_json()
    payload = {
        "facts": facts,
        "files": files,
        "lock": lock,
        "smoke": smoke_digest,
        # The wheels stage runs them: a change to how wheels are installed or split is a change to the image.
        "build_scripts": scripts_digest,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"sha256:{digest}"


def devel_id(runtime_id: str, devel: Target) -> str:
    """`sha256:…` of a devel image: its runtime image's id and its own facts (tag, labels, env differ)."""
    facts = devel.to_json()
    facts.pop("id")
    payload = {"runtime": runtime_id, "facts": facts}
    return "sha256:" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
