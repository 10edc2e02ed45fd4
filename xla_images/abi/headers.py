"""Which torch headers was an extension compiled against, and with which `_GLIBCXX_USE_CXX11_ABI`? Read from the
binary, checked against the torch beside it.

The ABI flag (`recorded_abi`): a build that records its command line (gcc -frecord-gcc-switches into
.GCC.command.line, -g into DW_AT_producer; cpp_extension passes -D_GLIBCXX_USE_CXX11_ABI=N on it) carries
`-D_GLIBCXX_USE_CXX11_ABI=N`; any binary whose code names a C++11-ABI type in a string (__PRETTY_FUNCTION__ of c10's
type names, typeinfo names: `std::__cxx11::`, `NSt7__cxx11`) was compiled with the C++11 ABI.

Symbols cannot show a release (inline code, struct layouts and operator schemas come from the headers), but the
headers leave a fingerprint: every `TORCH_INTERNAL_ASSERT` inlined from them embeds the message
`INTERNAL ASSERT FAILED at "<header path>":<line>, please report a bug to PyTorch.` The header and the line are
those of the release the extension was compiled against. Looked up in the installed torch's `torch/include`, each
such site either is an assertion there too (same headers) or is not (the header moved, or the line holds something
else: other headers, another release). An extension compiled here against torch 2.9.0 matches every site of
2.9.0's headers; one compiled against 2.8's headers fails on most (ivalue.h alone moves by dozens of lines).
"""
from __future__ import annotations

import mmap
import re
from dataclasses import dataclass
from pathlib import Path

from .words import CXX11, PRE_CXX11

# The message TORCH_INTERNAL_ASSERT builds from __FILE__ and __LINE__ (c10/util/Exception.h).
_ASSERTION_SITE = re.compile(rb'INTERNAL ASSERT FAILED at "([^"\x00\n]{1,512})":([0-9]{1,7}), please report a bug')
# Where a torch header's own path starts, in a wheel's include tree or a source checkout (aten/src/ATen/...).
_HEADER_ROOT = re.compile(r"(?:^|/)(?:torch/include/|aten/src/)?((?:ATen|c10|torch|caffe2)/.+)$")
# An assertion macro on the line (TORCH_INTERNAL_ASSERT, its _DEBUG_ONLY form, AT_ASSERT...): what __LINE__ pointed
# at when the extension was compiled.
_ASSERTION_MACRO = re.compile(r"\b[A-Z][A-Z0-9_]*ASSERT[A-Z0-9_]*\b")
# Headers whose inline code builds what an extension hands torch when it registers operators: boxed kernels,
# IValues, schemas, the dispatcher. Measured with operators.cpp (benchmarks/abi_mixes.py): compiled against torch
# 2.8 and imported beside 2.9 (or the reverse) it aborts with std::bad_alloc while registering, and 5 of its 16
# assertion sites differ, in ivalue.h, KernelFunction_impl.h and SymInt.h; compiled against 2.7 beside 2.8 (or the
# reverse) it works, and only c10/util/ArrayRef.h:62 differs.
REGISTRATION_HEADERS = ("ATen/core/boxing/", "ATen/core/ivalue", "ATen/core/function_schema", "ATen/core/dispatch/",
                        "ATen/core/op_registration/", "ATen/core/jit_type", "c10/core/SymInt", "torch/library.h")
# pybind11's internals id (detail/internals.h): modules share registered types only when their ids are equal.
_PYBIND11_INTERNALS = re.compile(rb"__pybind11_internals_v[0-9]+[A-Za-z0-9_]*__")
_ABI_FLAG = re.compile(rb"-D_GLIBCXX_USE_CXX11_ABI=([01])\b|(std::__cxx11::|NSt7__cxx11)")
MAX_SITES = 2000
MAX_SCANNED_BYTES = 1 << 30
SAME, OTHER = "this torch's headers", "another torch's headers"


@dataclass(frozen=True)
class HeaderEvidence:
    """The assertion sites of torch headers found in a binary, and which of them this torch's headers hold."""

    sites: int
    matching: int
    differing: tuple[str, ...]  # "ATen/core/ivalue.h:1352", up to a few, those of REGISTRATION_HEADERS first
    registration_differing: int = 0  # differing sites in REGISTRATION_HEADERS

    @property
    def verdict(self) -> str:
        return SAME if not self.differing else OTHER


def header_evidence(binary: Path, include: Path) -> HeaderEvidence | None:
    """The evidence, or None when the binary embeds no assertion site of torch's headers or this torch ships no
    headers (a stripped image): then nothing can be said."""
    if not include.is_dir():
        return None
    sites = _assertion_sites(binary)
    if not sites:
        return None
    lines_of: dict[str, list[str] | None] = {}
    differing: list[str] = []
    matching = 0
    for header, line in sorted(sites):
        if header not in lines_of:
            lines_of[header] = _read_lines(include, header)
        lines = lines_of[header]
        if lines is not None and 0 < line <= len(lines) and _ASSERTION_MACRO.search(lines[line - 1]):
            matching += 1
        else:
            differing.append(f"{header}:{line}")
    registration = [site for site in differing if site.startswith(REGISTRATION_HEADERS)]
    shown = registration + [site for site in differing if site not in registration]
    return HeaderEvidence(len(sites), matching, tuple(shown[:5]), len(registration))


def _assertion_sites(binary: Path) -> set[tuple[str, int]]:
    sites: set[tuple[str, int]] = set()
    try:
        with open(binary, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for match in _ASSERTION_SITE.finditer(data, 0, min(len(data), MAX_SCANNED_BYTES)):
                header = _HEADER_ROOT.search(match.group(1).decode("latin-1"))
                if header is not None:
                    sites.add((header.group(1), int(match.group(2))))
                    if len(sites) >= MAX_SITES:
                        break
    except (OSError, ValueError):
        return set()  # empty or unreadable: the symbol check has already read (or refused) the file
    return sites


def _read_lines(include: Path, header: str) -> list[str] | None:
    if ".." in Path(header).parts:
        return None
    try:
        return (include / header).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None


def recorded_abi(binary: Path) -> tuple[str, str] | None:
    """(cxx11 | pre-cxx11, the evidence) from the recorded build flag, else ("cxx11", the string) from a C++11-ABI
    type named in the binary's strings; None when the binary says neither."""
    named: str | None = None
    try:
        with open(binary, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for match in _ABI_FLAG.finditer(data, 0, min(len(data), MAX_SCANNED_BYTES)):
                if match.group(1) is not None:
                    return (CXX11 if match.group(1) == b"1" else PRE_CXX11,
                            f"built with -D_GLIBCXX_USE_CXX11_ABI={match.group(1).decode()} (recorded in the binary)")
                named = named or match.group(2).decode()
    except (OSError, ValueError):
        return None
    return (CXX11, f"its strings name C++11-ABI types ({named}...)") if named else None


def pybind11_internals(binary: Path) -> str | None:
    """The pybind11 internals id a binary was built with (`__pybind11_internals_v11_system_libstdcpp_..._1__`), or
    None when it embeds none (no pybind11)."""
    try:
        with open(binary, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            match = _PYBIND11_INTERNALS.search(data, 0, min(len(data), MAX_SCANNED_BYTES))
            return match.group(0).decode("ascii") if match else None  # while the map is open
    except (OSError, ValueError):
        return None
