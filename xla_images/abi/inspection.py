"""`inspect`: the C++ ABI and the GLIBC/GLIBCXX needs of each shared object of a wheel, a directory or a file,
and a verdict per package (its ABI, whether its platform tag promises an older glibc than it needs, whether a
local version label such as +cxx11 contradicts its symbols).

A shared object is cxx11, pre-cxx11, ``none`` (no string in its interface) or ``mixed`` (both); see
`SharedObjectReport` for why names in namespace std only count when nothing else shows an ABI. A package is cxx11
when all its string-using objects are, and so on; bundled libstdc++/libgcc copies are reported but left out.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from .elf import ElfDynamic, has_elf_magic, read_elf_file
from .files import WalkNotes, missing_path_error, walk_shared_objects
from .mangling import count_abi_symbols
from .wheel import read_wheel
from .words import CXX11, MIXED, NO_STRINGS, PRE_CXX11, RULE_ELF, some, usage_error

# Toolchain runtimes that wheels bundle (auditwheel renames them lib<name>-<hash>.so.N). libstdc++ deliberately
# exports BOTH ABIs (that is how the dual ABI works), so its symbols say nothing about how the package's own code
# was compiled: it is reported (usually as 'mixed') but never decides the package verdict.
_BUNDLED_RUNTIME = re.compile(r"^lib(?:stdc\+\+|gcc_s|gomp|atomic|quadmath|gfortran)(?:-[0-9a-f]+)?\.so")

_WHEEL_FILENAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>[0-9][^-]*))?-(?P<python>[^-]+)-(?P<abi>[^-]+)"
    r"-(?P<platform>[^-]+)\.whl$"
)
_GLIBC_IN_TAG = re.compile(r"^manylinux_([0-9]+)_([0-9]+)_")
_LEGACY_MANYLINUX_GLIBC = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@dataclass(frozen=True)
class SharedObjectReport:
    """The ABI of one shared object and the newest GLIBC / GLIBCXX symbol versions it needs.

    cxx11_symbols / pre_cxx11_symbols count every dynamic symbol (defined or undefined) showing that ABI. The
    verdict `abi` comes from the first of three tiers that shows any ABI (`abi_basis`):

    * "interface": symbols outside namespace std, defined or referenced (`torch::foo(std::string const&)`
      counts here: the string is in its signature). This is what other libraries bind to.
    * "std definitions": std members the library instantiated itself (inline std::string code, std::vector
      of strings...): they show the flag its own code was compiled with.
    * "std references": references into libstdc++ (`_ZNSs...`, `_ZNSt7__cxx11...`), for libraries that use
      strings only inside.
    References into libstdc++ never fail a load (it exports both ABIs), and cxx11 builds made with gcc-toolset
    carry a few old-ABI ones from its static libstdc++_nonshared.a: torch 2.9's libtorch.so exports only std
    instantiations (cxx11) yet references `std::basic_string::_Rep::_S_empty_rep_storage`. Counting every tier
    at once would call it 'mixed'.
    """

    path: str
    abi: str
    glibc: str | None
    glibcxx: str | None
    cxx11_symbols: int
    pre_cxx11_symbols: int
    bundled_runtime: bool = False
    abi_basis: str = "interface"  # INTERFACE_BASIS, STD_DEFINITIONS_BASIS or STD_REFERENCES_BASIS

    def to_json(self) -> dict:
        return {
            "path": self.path, "abi": self.abi, "glibc": self.glibc, "glibcxx": self.glibcxx,
            "cxx11_symbols": self.cxx11_symbols, "pre_cxx11_symbols": self.pre_cxx11_symbols,
            "abi_basis": self.abi_basis, "bundled_runtime": self.bundled_runtime,
        }


@dataclass(frozen=True)
class PackageReport:
    """A wheel, directory or image site-packages: its ABI, platform tag and a one-line verdict."""

    path: str
    kind: str  # "wheel" | "directory" | "image" | "file"
    abi: str
    platform_tag: str | None
    verdict: str
    shared_objects: tuple[SharedObjectReport, ...]
    glibc: str | None = None
    glibcxx: str | None = None

    def to_json(self) -> dict:
        return {
            "path": self.path, "kind": self.kind, "abi": self.abi, "platform_tag": self.platform_tag,
            "verdict": self.verdict, "glibc": self.glibc, "glibcxx": self.glibcxx,
            "shared_objects": [report.to_json() for report in self.shared_objects],
        }


# Names in namespace std (or __gnu_cxx), also as special names: vtable, VTT, typeinfo (name), guard variable,
# transaction clone, thunks; and member functions with cv/ref qualifiers.
_STD_NAME = re.compile(
    r"_Z(?:T[VTIS]|GV|GTt|Thn?[0-9]+_|Tvn?[0-9]+_n?[0-9]+_)?N?[rVKRO]*(?:S[tsbaiod]|9__gnu_cxx)"
)
INTERFACE_BASIS, STD_DEFINITIONS_BASIS, STD_REFERENCES_BASIS = "interface", "std definitions", "std references"


def classify_dynamic(info: ElfDynamic, path: str) -> SharedObjectReport:
    """Classify from an already read symbol table; see SharedObjectReport for the rules."""
    tiers: dict[str, list[str]] = {INTERFACE_BASIS: [], STD_DEFINITIONS_BASIS: [], STD_REFERENCES_BASIS: []}
    for name in info.defined:
        tiers[STD_DEFINITIONS_BASIS if _STD_NAME.match(name) else INTERFACE_BASIS].append(name)
    for symbol in info.undefined:
        tiers[STD_REFERENCES_BASIS if _STD_NAME.match(symbol.name) else INTERFACE_BASIS].append(symbol.name)
    counts = {basis: count_abi_symbols(names) for basis, names in tiers.items()}
    basis = next((basis for basis, found in counts.items() if any(found)), INTERFACE_BASIS)
    versions = [version for names in info.version_needs.values() for version in names]
    return SharedObjectReport(
        path=path,
        abi=_abi_from_counts(*counts[basis]),
        glibc=_newest_version(versions, "GLIBC_"),
        glibcxx=_newest_version(versions, "GLIBCXX_"),
        cxx11_symbols=sum(found[0] for found in counts.values()),
        pre_cxx11_symbols=sum(found[1] for found in counts.values()),
        bundled_runtime=_BUNDLED_RUNTIME.match(os.path.basename(path)) is not None,
        abi_basis=basis,
    )


def classify_shared_object(path: Path | str) -> SharedObjectReport:
    """Classify one ELF shared object on disk."""
    path = Path(path)
    if not has_elf_magic(path):
        raise usage_error(f"{path} is not an ELF shared object", hint="pass a .so file, a wheel or a directory",
                           rule=RULE_ELF)
    return classify_dynamic(read_elf_file(path), str(path))


def _abi_from_counts(cxx11: int, pre_cxx11: int) -> str:
    if cxx11 and pre_cxx11:
        return MIXED
    if cxx11:
        return CXX11
    return PRE_CXX11 if pre_cxx11 else NO_STRINGS


def _newest_version(versions: Iterable[str], prefix: str) -> str | None:
    best: tuple[int, ...] | None = None
    for version in versions:
        rest = version[len(prefix):] if version.startswith(prefix) else ""
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)*", rest):
            number = tuple(int(part) for part in rest.split("."))
            best = number if best is None or number > best else best
    return None if best is None else ".".join(str(part) for part in best)


def package_abi(reports: Iterable[SharedObjectReport]) -> str:
    """cxx11 if every string-using object is cxx11, pre-cxx11 likewise, none if none uses strings, else mixed."""
    kinds = {report.abi for report in _deciding_objects(list(reports))}
    if not kinds:
        return NO_STRINGS
    return kinds.pop() if len(kinds) == 1 else MIXED


def _deciding_objects(reports: list[SharedObjectReport]) -> list[SharedObjectReport]:
    """The string-using objects a package's ABI is judged by, tiered like SharedObjectReport.abi_basis.

    Objects whose interface shows an ABI decide; objects that show one only through std symbols count only
    when no interface does. Another library binds to interfaces, so a library that embeds a static libstdc++
    exporting both ABIs' std code (NVIDIA's libcufile) must not make a site-packages 'mixed'. Bundled
    toolchain runtimes (see _BUNDLED_RUNTIME) are left out unless there is nothing else.
    """
    considered = [report for report in reports if not report.bundled_runtime] or reports
    using = [report for report in considered if report.abi != NO_STRINGS]
    by_interface = [report for report in using if report.abi_basis == INTERFACE_BASIS]
    return by_interface or using


def inspect_path(path: Path) -> PackageReport:
    """Inspect a wheel (read from the zip), a directory such as a site-packages, or one shared object."""
    path = Path(path)
    if path.is_dir():
        return inspect_directory(path, kind="directory", display=str(path))
    if path.is_file() and path.suffix == ".whl":
        return _inspect_wheel(path)
    if path.is_file() and has_elf_magic(path):
        report = classify_shared_object(path)
        return _package("file", str(path), (report,), platform_tag=None, version=None)
    if path.exists():
        raise usage_error(f"{path} is neither a wheel, a directory nor an ELF shared object",
                          hint="pass a .whl file, a site-packages directory, a .so file or an image reference")
    raise missing_path_error(path, "check the path, or pass an image reference")


def inspect_path_target(target: str) -> PackageReport:
    """The command line's path argument (`~` expanded)."""
    return inspect_path(Path(target).expanduser())


def inspect_directory(root: Path, *, kind: str, display: str) -> PackageReport:
    """Every shared object under root (an image's site-packages is kind "image")."""
    reports = []
    notes = WalkNotes()
    for relative, full in walk_shared_objects(root, notes):
        reports.append(classify_dynamic(read_elf_file(full, os.path.join(display, relative)), relative))
    package = _package(kind, display, tuple(reports), platform_tag=None, version=None)
    if not notes.outside:
        return package
    return replace(package, verdict=package.verdict + outside_remark(notes))


def outside_remark(notes: WalkNotes) -> str:
    """What a report says of the directory links the walk did not follow."""
    return (f"; not read: {len(notes.outside)} directory link(s) leading out of the tree ({some(notes.outside)})"
            if notes.outside else "")


def _inspect_wheel(path: Path) -> PackageReport:
    libraries, tags = read_wheel(path)
    reports = tuple(classify_dynamic(dynamic, name) for name, dynamic in libraries)
    filename = _WHEEL_FILENAME.match(path.name)
    platform_tag = filename.group("platform") if filename else (".".join(tags) or None)
    version = filename.group("version") if filename else None
    return _package("wheel", str(path), reports, platform_tag=platform_tag, version=version)


def _package(kind: str, display: str, reports: tuple[SharedObjectReport, ...], *, platform_tag: str | None,
             version: str | None) -> PackageReport:
    abi = package_abi(reports)
    glibc = _newest_version((f"GLIBC_{r.glibc}" for r in reports if r.glibc), "GLIBC_")
    glibcxx = _newest_version((f"GLIBCXX_{r.glibcxx}" for r in reports if r.glibcxx), "GLIBCXX_")
    verdict = _package_verdict(abi, reports, glibc, glibcxx, platform_tag, version)
    return PackageReport(display, kind, abi, platform_tag, verdict, reports, glibc, glibcxx)


_ABI_WORDS = {
    CXX11: "C++11 ABI (cxx11)",
    PRE_CXX11: "pre-C++11 ABI (pre-cxx11)",
    NO_STRINGS: "no std::string in any interface (none)",
}


def _package_verdict(abi: str, reports: Sequence[SharedObjectReport], glibc: str | None, glibcxx: str | None,
                     platform_tag: str | None, version: str | None) -> str:
    own = [report for report in reports if not report.bundled_runtime]
    if not reports:
        return "no ELF shared objects"
    if not own:
        return (f"only toolchain runtimes ({', '.join(os.path.basename(report.path) for report in reports)}); "
                "libstdc++ exports both ABIs on purpose")
    deciding = _deciding_objects(list(reports))
    if abi == MIXED:
        parts = []
        for kind in (CXX11, PRE_CXX11, MIXED):
            names = [os.path.basename(report.path) for report in deciding if report.abi == kind]
            if names:
                parts.append(f"{kind} in {some(names)}")
        text = "MIXED ABI: " + "; ".join(parts) + " - its libraries were built with different ABIs"
    else:
        users = sum(report.abi != NO_STRINGS for report in own)
        text = f"{_ABI_WORDS[abi]}, {users} of {len(own)} shared objects use std::string"
    ignored = [f"{os.path.basename(report.path)} ({report.abi}, from {report.abi_basis})" for report in own
               if report.abi not in (abi, NO_STRINGS) and report not in deciding]
    if ignored:
        text += f"; not counted: {some(ignored)}"
    needs = [f"GLIBC {glibc}" if glibc else "", f"GLIBCXX {glibcxx}" if glibcxx else ""]
    if any(needs):
        text += "; needs " + ", ".join(need for need in needs if need)
    text += _tag_remark(glibc, platform_tag)
    text += _label_remark(abi, version)
    return text


def _tag_remark(glibc: str | None, platform_tag: str | None) -> str:
    if not platform_tag:
        return ""
    promised = [_tag_glibc(part) for part in platform_tag.split(".")]
    promised = [version for version in promised if version]
    if not promised or not glibc:
        return f"; tagged {platform_tag}"
    needed = tuple(int(part) for part in glibc.split("."))
    if needed > min(promised):
        oldest = ".".join(map(str, min(promised)))
        return f"; WRONG TAG {platform_tag}: promises glibc {oldest} but needs {glibc}"
    return f"; fits {platform_tag}"


def _tag_glibc(tag: str) -> tuple[int, int] | None:
    match = _GLIBC_IN_TAG.match(tag)
    if match:
        return int(match.group(1)), int(match.group(2))
    return _LEGACY_MANYLINUX_GLIBC.get(tag.split("_", 1)[0])


def _label_remark(abi: str, version: str | None) -> str:
    """Upstream marks ABI variants in the local version (+cxx11, +precxx11, +cpu.cxx11.abi): do they agree?"""
    label = version.partition("+")[2].lower() if version else ""
    if "cxx11" not in label or abi not in (CXX11, PRE_CXX11):
        return ""
    claimed = PRE_CXX11 if "pre" in label else CXX11
    return "" if claimed == abi else f"; LABEL +{label} CLAIMS {claimed} but the symbols are {abi}"
