"""A flavour: one image the matrix declares, with every fact about it computed once, here.

Nobody else derives a tag, an ABI flag, a label or an environment variable from strings: they read them off the
Flavour. A Flavour holds matrix facts only, the same on every site; matrix.py creates them. What a site adds
(wheel source, base image, and so the requirement pins and the content-addressed id) is a Target (target.py).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from ..errors import Location
from ..names import (DEVEL_STAGE, ENV_PREFIX, IMAGE_CONSTRAINTS, LABEL_PREFIX, PROJECT_URL, RUNTIME_STAGE, TAG_LABEL,
                     VARIANT_LABEL, WHEEL_BUILD_SCRIPT, WHEEL_BUILDS_DIR)



# The packages built against one torch release that a derived image installs most often (docs/derived.md): the
# version of each that pins a release's torch is a release fact `update` learns from the index, and every image's
# constraints pin it; a release may install them (`companions:` in matrix.yaml).
COMPANIONS = ("torchvision", "torchaudio")


class Abi(str, enum.Enum):
    """The libstdc++ dual ABI a flavour's torch and torch_xla are built with."""

    CXX11 = "cxx11"
    PRE_CXX11 = "pre-cxx11"

    @property
    def glibcxx_use_cxx11_abi(self) -> int:
        """The value of `_GLIBCXX_USE_CXX11_ABI` (and upstream's `CXX_ABI`) for this ABI."""
        return 1 if self is Abi.CXX11 else 0

    @property
    def tag_word(self) -> str:
        """Upstream's word for the ABI in tags and wheel local versions (`+cxx11`, `_precxx11`)."""
        return "cxx11" if self is Abi.CXX11 else "precxx11"

    @property
    def title(self) -> str:
        return "C++11" if self is Abi.CXX11 else "pre-C++11"

    def __str__(self) -> str:
        return self.value


class Channel(str, enum.Enum):
    """Where a release's torch/torch_xla come from: tagged releases, or dated nightly builds."""

    RELEASE = "release"
    NIGHTLY = "nightly"

    def __str__(self) -> str:
        return self.value


class Accelerator(str, enum.Enum):
    TPU = "tpu"
    CPU = "cpu"

    @property
    def tag_word(self) -> str:
        # Upstream's TPU images say `tpuvm`; CPU images get a word of their own so tags never collide.
        return "tpuvm" if self is Accelerator.TPU else "cpu"

    @property
    def pjrt_device(self) -> str:
        return "TPU" if self is Accelerator.TPU else "CPU"

    def __str__(self) -> str:
        return self.value


class Variant(str, enum.Enum):
    """Which image of a flavour: the runtime image, or the devel image built FROM it (a C++ toolchain on top).

    A devel image is the runtime image's layers plus a few of its own (the Dockerfile's `devel` stage is
    `FROM runtime`), so it shares the runtime's Dockerfile, lock and layers; it differs by tag, labels and env.
    """

    RUNTIME = "runtime"
    DEVEL = "devel"

    @property
    def tag_suffix(self) -> str:
        """`_devel` after the runtime tag (and each alias): `r2.9.0_3.11_cpu_devel`."""
        return "" if self is Variant.RUNTIME else f"_{self.value}"

    @property
    def stage(self) -> str:
        """The Dockerfile stage the image is (`docker build --target`)."""
        return RUNTIME_STAGE if self is Variant.RUNTIME else DEVEL_STAGE

    def __str__(self) -> str:
        return self.value


def default_base_image(python: str) -> str:
    """The base a rendered Dockerfile names; sites override it per python (site.yaml `bases`)."""
    return f"python:{python}-slim-bookworm"


def minor(version: str) -> str:
    """`2.9.0` -> `2.9`."""
    return ".".join(version.split(".")[:2])


def make_tag(torch_xla: str, python: str, accelerator: Accelerator, abi: Abi, release_default_abi: Abi) -> str:
    """Upstream-compatible tag: `r2.6.0_3.11_tpuvm`, `r2.6.0_3.11_tpuvm_cxx11`, `r2.9.0_3.11_tpuvm_precxx11`.

    The ABI word appears only when the flavour's ABI is not the release's default, as upstream does.
    """
    return make_tag_prefix(torch_xla, python, accelerator) + abi_suffix(abi, release_default_abi)


def make_tag_prefix(version: str, python: str, accelerator: Accelerator) -> str:
    return f"r{version}_{python}_{accelerator.tag_word}"


def abi_suffix(abi: Abi, release_default_abi: Abi) -> str:
    return "" if abi is release_default_abi else f"_{abi.tag_word}"


NIGHTLY_WORD = "nightly"
# `2.10.0.dev20261203`, optionally with a local label (`+cpu`): the date upstream stamps on its nightlies.
_DEV_DATE = re.compile(r"^(?P<base>\d+\.\d+\.\d+)\.dev(?P<date>\d{8})(?:\+[A-Za-z0-9.]+)?$")


def make_nightly_tag(python: str, accelerator: Accelerator, abi: Abi, release_default_abi: Abi) -> str:
    """Upstream's moving nightly tag: `nightly_3.11_tpuvm` (+ `_cxx11`/`_precxx11` off the default ABI)."""
    return f"{NIGHTLY_WORD}_{python}_{accelerator.tag_word}{abi_suffix(abi, release_default_abi)}"


def dated_tag(nightly_tag: str, date: str) -> str:
    """The immutable copy of one night: `nightly_3.11_tpuvm_20261203`."""
    return f"{nightly_tag}_{date}"


def dev_date(version: str) -> str | None:
    """`2.10.0.dev20261203` -> `20261203`; None for anything that is not a dated dev build."""
    match = _DEV_DATE.match(version)
    return match.group("date") if match else None


def dev_base(version: str) -> str | None:
    """`2.10.0.dev20261203+cpu` -> `2.10.0`: the release a nightly leads up to."""
    match = _DEV_DATE.match(version)
    return match.group("base") if match else None


def nightly_specifier(base: str) -> str:
    """Every dev build leading up to `base`: what a nightly lock resolves (pip then takes the newest night).

    The upper bound is `<2.10.0a0`, not `<2.10.0`: PEP 440 makes `<V` exclude V's own pre-releases, dev builds
    included, and dev builds sort before a0.
    """
    return f">={base}.dev0,<{base}a0"


@dataclass(frozen=True)
class WheelBuild:
    """One from-source build of torch + torch_xla: what differs between wheel builds, nothing more.

    Flavours that differ only by accelerator build the same wheels, so they share one WheelBuild.
    """

    torch_xla: str
    torch: str
    python: str
    abi: Abi
    release_default_abi: Abi
    pytorch_git_rev: str
    xla_git_rev: str

    @property
    def name(self) -> str:
        """`r2.6.0_3.11_cxx11`: the release, the python and, always, the ABI (there is no accelerator here)."""
        return f"r{self.torch_xla}_{self.python}_{self.abi.tag_word}"

    @property
    def local_version(self) -> str:
        """Upstream's wheel naming for builds in the release's non-default ABI: `+cxx11` / `+precxx11`."""
        return "" if self.abi is self.release_default_abi else f"+{self.abi.tag_word}"

    @property
    def params_path(self) -> str:
        """The rendered parameter file, relative to the repository root."""
        return f"{WHEEL_BUILDS_DIR}/{self.name}.env"

    @property
    def command(self) -> str:
        return f"{WHEEL_BUILD_SCRIPT} {self.name}"


@dataclass(frozen=True)
class Flavour:
    """One image. Immutable; every derived fact is a field or a property computed from fields."""

    torch_xla: str
    torch: str
    python: str
    abi: Abi
    accelerator: Accelerator
    libtpu: str | None
    release_default_abi: Abi
    pytorch_git_rev: str
    xla_git_rev: str
    declared_at: str  # the release in matrix.yaml (file:line)
    aliases: tuple[str, ...] = ()
    extra_labels: tuple[tuple[str, str], ...] = field(default=())
    channel: Channel = Channel.RELEASE
    # Nightly flavours: the release the dev builds lead up to (`2.10.0`). torch/torch_xla hold that version
    # until the lock pins one night's builds; then they hold the exact locked versions (`with_nightly`).
    nightly_base: str = ""
    # Where the rules that need the site point (target.bind): the release's `abis` and `channel` lines, or the
    # release itself when it inherits them.
    abis_declared_at: Location | None = None
    channel_declared_at: Location | None = None
    # The runtime image, or its devel image (Variant). matrix.py declares runtime flavours; `devel` derives the
    # other, with its aliases suffixed like its tag.
    variant: Variant = Variant.RUNTIME
    # (name, version) of each companion the release records (COMPANIONS order), and the names it installs.
    companion_versions: tuple[tuple[str, str], ...] = ()
    companions: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return self.runtime_tag + self.variant.tag_suffix

    @property
    def runtime_tag(self) -> str:
        """The runtime image's tag: the tag of a runtime flavour, the tag a devel flavour is built FROM. Its
        Dockerfile and lock live under Dockerfiles/<runtime_tag>/ (the devel image is a stage of it)."""
        if self.is_nightly:
            return make_nightly_tag(self.python, self.accelerator, self.abi, self.release_default_abi)
        return make_tag(self.torch_xla, self.python, self.accelerator, self.abi, self.release_default_abi)

    @property
    def is_devel(self) -> bool:
        return self.variant is Variant.DEVEL

    @property
    def devel(self: AnyFlavour) -> AnyFlavour:
        """This runtime flavour's devel variant: the same facts, the tag and every alias suffixed `_devel`."""
        import dataclasses

        if self.is_devel:
            return self
        suffix = Variant.DEVEL.tag_suffix
        return dataclasses.replace(self, variant=Variant.DEVEL, aliases=tuple(a + suffix for a in self.aliases))

    @property
    def runtime(self: AnyFlavour) -> AnyFlavour:
        """The runtime flavour a devel one is built FROM (itself for a runtime flavour)."""
        import dataclasses

        if not self.is_devel:
            return self
        suffix = Variant.DEVEL.tag_suffix
        return dataclasses.replace(self, variant=Variant.RUNTIME,
                                   aliases=tuple(a[: -len(suffix)] for a in self.aliases))

    @property
    def is_nightly(self) -> bool:
        return self.channel is Channel.NIGHTLY

    @property
    def nightly_date(self) -> str | None:
        """The night (YYYYMMDD) whose torch_xla the flavour installs; None until a lock pins one."""
        return dev_date(self.torch_xla) if self.is_nightly else None

    @property
    def nightly_dated_tag(self) -> str | None:
        date = self.nightly_date
        return dated_tag(self.runtime_tag, date) + self.variant.tag_suffix if date else None

    def with_nightly(self, torch: str, torch_xla: str) -> Flavour:
        """This nightly flavour pinned to one night's builds; the dated tag becomes its alias."""
        import dataclasses

        pinned = dataclasses.replace(self, torch=torch, torch_xla=torch_xla)
        return dataclasses.replace(pinned, aliases=(str(pinned.nightly_dated_tag),))

    @property
    def installed_companions(self) -> tuple[tuple[str, str], ...]:
        """(name, version) of each companion the image installs, in COMPANIONS order."""
        return tuple((name, version) for name, version in self.companion_versions if name in self.companions)

    @property
    def tags(self) -> tuple[str, ...]:
        """The tag first, then its aliases: everything this flavour is published under."""
        return (self.tag, *self.aliases)

    @property
    def is_default_abi(self) -> bool:
        return self.abi is self.release_default_abi

    @property
    def release_minor(self) -> str:
        return minor(self.torch_xla)

    @property
    def wheel_build(self) -> WheelBuild:
        """The from-source wheel build this flavour's wheels come from (the same for its cpu and tpu siblings)."""
        return WheelBuild(self.torch_xla, self.torch, self.python, self.abi, self.release_default_abi,
                          self.pytorch_git_rev, self.xla_git_rev)

    @property
    def wheel_local_version(self) -> str:
        return self.wheel_build.local_version

    @property
    def env(self) -> dict[str, str]:
        """Environment baked into the image; the smoke suite reads its expectations from here."""
        env = self._release_env
        if self.is_nightly:
            env[f"{ENV_PREFIX}_NIGHTLY_DATE"] = self.nightly_date or ""
        if self.is_devel:
            env[f"{ENV_PREFIX}_VARIANT"] = self.variant.value
            # `pip wheel .` of an extension builds against the image's torch (whose flag sets the ABI), not
            # against a torch pip would download into an isolated build environment ("0" turns isolation off).
            env["PIP_NO_BUILD_ISOLATION"] = "0"
        if self.companions:  # what the smoke suite holds the installed companions to
            env[f"{ENV_PREFIX}_COMPANIONS"] = companion_words(self.installed_companions)
        return env

    @property
    def _release_env(self) -> dict[str, str]:
        return {
            "PJRT_DEVICE": self.accelerator.pjrt_device,
            f"{ENV_PREFIX}_TAG": self.tag,
            f"{ENV_PREFIX}_ABI": self.abi.value,
            f"{ENV_PREFIX}_PYTHON": self.python,
            f"{ENV_PREFIX}_TORCH": self.torch,
            f"{ENV_PREFIX}_TORCH_XLA": self.torch_xla,
            f"{ENV_PREFIX}_LIBTPU": self.libtpu or "",
            f"{ENV_PREFIX}_ACCELERATOR": self.accelerator.value,
            # pip / uv in a derived image keep to the lock's pins (docs/derived.md); `PIP_CONSTRAINT=` opts out.
            "PIP_CONSTRAINT": IMAGE_CONSTRAINTS,
            "UV_CONSTRAINT": IMAGE_CONSTRAINTS,
        }

    @property
    def labels(self) -> dict[str, str]:
        """Static OCI and flavour labels. The flavour id label is added at build time (it hashes these files)."""
        labels = {
            "org.opencontainers.image.title": f"xla-images {self.tag}",
            "org.opencontainers.image.description": (
                f"PyTorch/XLA {self.torch_xla} with torch {self.torch}, python {self.python}, "
                f"{self.abi.title} ABI, {self.accelerator.value}"
            ),
            "org.opencontainers.image.version": self.tag,
            "org.opencontainers.image.source": PROJECT_URL,
            "org.opencontainers.image.licenses": "BSD-3-Clause",
            TAG_LABEL: self.tag,
            f"{LABEL_PREFIX}.torch": self.torch,
            f"{LABEL_PREFIX}.torch-xla": self.torch_xla,
            f"{LABEL_PREFIX}.python": self.python,
            f"{LABEL_PREFIX}.abi": self.abi.value,
            f"{LABEL_PREFIX}.accelerator": self.accelerator.value,
            f"{LABEL_PREFIX}.libtpu": self.libtpu or "none",
        }
        if self.is_nightly:
            # What the image checks hold the installed torch_xla to before a push (pytorch/xla#8475).
            labels[f"{LABEL_PREFIX}.channel"] = self.channel.value
            labels[f"{LABEL_PREFIX}.nightly-date"] = self.nightly_date or "unpinned"
        if self.is_devel:
            labels["org.opencontainers.image.description"] += ", devel (C++ toolchain for extensions)"
            labels[VARIANT_LABEL] = self.variant.value
            labels[f"{LABEL_PREFIX}.runtime-tag"] = self.runtime_tag
        if self.companions:
            labels[f"{LABEL_PREFIX}.companions"] = companion_words(self.installed_companions)
        labels.update(dict(self.extra_labels))
        return labels

    @property
    def filter_facts(self) -> dict[str, str]:
        """The facts `list`, `build` and `resolve` select flavours by (`facts_match`)."""
        return {"abi": self.abi.value, "python": self.python, "torch_xla": self.torch_xla,
                "accelerator": self.accelerator.value, "variant": self.variant.value}

    def matches(
        self,
        *,
        abi: str | None = None,
        python: str | None = None,
        torch_xla: str | None = None,
        accelerator: str | None = None,
        variant: str | None = None,
    ) -> bool:
        """Filter used by list/build/resolve. `torch_xla` may be a prefix such as `2.9` (matches 2.9.x)."""
        return facts_match(self.filter_facts, {"abi": abi, "python": python, "torch_xla": torch_xla,
                                               "accelerator": accelerator, "variant": variant})


def companion_words(pins: tuple[tuple[str, str], ...]) -> str:
    """`torchvision==0.24.0 torchaudio==2.9.0`: the installed companions as the image's env and label say them."""
    return " ".join(f"{name}=={version}" for name, version in pins)


# What a function that takes Flavours or Targets gives back: the same kind it was given.
AnyFlavour = TypeVar("AnyFlavour", bound=Flavour)


def facts_match(facts: Mapping[str, Any], filters: Mapping[str, str | None]) -> bool:
    """Whether flavour facts pass the filters: a Flavour's, or the ones a published.json entry recorded.

    A filter that is None is no filter; `torch_xla` may be a prefix such as `2.9` (matches 2.9.x); every other
    fact must equal the filter as text.
    """
    for key, wanted in filters.items():
        if wanted is None:
            continue
        value = fact(facts, key)
        if key == "torch_xla":
            if not _version_prefix_matches(value, wanted):
                return False
        elif value != wanted:
            return False
    return True


def fact(facts: Mapping[str, Any], key: str) -> str:
    """One filter fact of a flavour's facts, as text. A runtime image's facts carry no `variant` (so its records
    read as before devel images existed): it is `runtime`."""
    return str(facts.get(key, Variant.RUNTIME.value if key == "variant" else None))


def _version_prefix_matches(version: str, wanted: str) -> bool:
    parts = version.split(".")
    wanted_parts = wanted.split(".")
    return parts[: len(wanted_parts)] == wanted_parts
