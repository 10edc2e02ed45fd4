"""Which torch headers was an extension compiled against, and with which `_GLIBCXX_USE_CXX11_ABI`? Read from the
binary, checked against the torch beside it.

The ABI flag (`recorded_abi`): a build that records its command line (gcc -frecord-gcc-switches into
.GCC.command.line, -g into DW_AT_producer; cpp_extension passes -D_GLIBCXX_USE_CXX11_ABI=N on it) carries
`-D_GLIBCXX_USE_CXX11_ABI=N`; any binary whose code names a C++11-ABI type in a string (__PRETTY_FUNCTION__ of c10's
type names, typeinfo names: `std::__cxx11::`, `NSt7__cxx11`) was compiled with the C++11 ABI.

Symbols cannot show a release (inline code, struct layouts and operator schemas come from the headers), but the
headers leave a fingerprint: every `TORCH_INTERNAL_ASSERT` inlined from them embeds the message
`<condition> INTERNAL ASSERT FAILED at "<header path>":<line>, please report a bug to PyTorch.` The header and the
line are those of the release the extension was compiled against. Looked up in the installed torch's
`torch/include`, each site is one of three things:

* held: the same assertion (the same condition, when the binary names one) at the same line;
* moved: the same condition a few lines away (at most DRIFT_LINES): the same code, shifted by edits above it;
* changed: neither (the header is gone, the condition is nowhere near, or no condition to look for and the line
  holds something else).

Only changed sites of the headers that shape registration count against an extension that registers operators.
Line numbers alone drift between releases with no change to the code around them (issue 34's false alarm: a custom
class compiled against torch 2.6's headers, loaded by 2.7, works; its ivalue.h:1315 is 1317 in 2.7 because two
method declarations, `toSymIntList`, were added above it, and custom_class.h:491 is 490 because a comment went).
The condition alone is not enough either: between 2.8 and 2.9 every differing site of operators.cpp keeps its
condition, but ivalue.h:1317 moves to 1352 and KernelFunction_impl.h:265 to 303, after IValue gained the UInt tag
and KernelFunction a `tokens_` member (a layout change: the extension aborts while registering).
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
# How far (in lines) an assertion with the same condition may have moved and still be the same code. Measured
# (benchmarks/abi_mixes.py): 1 and 2 lines for torch 2.6 -> 2.7 (works), 35 and 38 for 2.8 <-> 2.9 (aborts).
DRIFT_LINES = 8
# The condition TORCH_INTERNAL_ASSERT stringizes before the message: the string's start is at most this far back.
MAX_CONDITION = 1024
_COMMENT = re.compile(r"//.*$")  # a line comment: not part of the stringized condition
_WRAPPED_LINES = 24  # lines after the macro's that its condition may span
MAX_SITES = 2000
MAX_SCANNED_BYTES = 1 << 30
SAME, OTHER = "this torch's headers", "another torch's headers"


@dataclass(frozen=True)
class HeaderEvidence:
    """The assertion sites of torch headers found in a binary, and which of them this torch's headers hold."""

    sites: int
    matching: int  # held at the same line
    differing: tuple[str, ...]  # changed: "ATen/core/ivalue.h:1352", up to a few, those of REGISTRATION_HEADERS first
    registration_differing: int = 0  # changed sites in REGISTRATION_HEADERS
    moved: tuple[str, ...] = ()  # "ATen/core/ivalue.h:1315 (1317 here)": the same condition, a few lines away

    @property
    def verdict(self) -> str:
        return SAME if not self.differing and not self.moved else OTHER


@dataclass(frozen=True)
class _Site:
    header: str
    line: int
    condition: str  # as stringized by the macro; "" when the binary shows none before the message


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
    moved: list[str] = []
    matching = 0
    for site in sorted(sites, key=lambda item: (item.header, item.line, item.condition)):
        if site.header not in lines_of:
            lines_of[site.header] = _read_lines(include, site.header)
        found = _locate(site, lines_of[site.header])
        if found == site.line:
            matching += 1
        elif found is not None:
            moved.append(f"{site.header}:{site.line} ({found} here)")
        else:
            differing.append(f"{site.header}:{site.line}")
    registration = [site for site in differing if site.startswith(REGISTRATION_HEADERS)]
    shown = registration + [site for site in differing if site not in registration]
    return HeaderEvidence(len(sites), matching, tuple(shown[:5]), len(registration), tuple(moved[:5]))


def _locate(site: _Site, lines: list[str] | None) -> int | None:
    """The line of this torch's header holding the site's assertion: its own line when an assertion with the same
    condition (or, without one, any assertion) is there, else the nearest line within DRIFT_LINES with the same
    condition; None when there is none."""
    if lines is None or not 0 < site.line <= len(lines) + DRIFT_LINES:
        return None
    if not site.condition:
        return site.line if site.line <= len(lines) and _ASSERTION_MACRO.search(lines[site.line - 1]) else None
    wanted = re.compile(r"[A-Z][A-Z0-9_]*ASSERT[A-Z0-9_]*\(" + re.escape(_squeeze(site.condition)) + r"[,)]")
    for distance in range(DRIFT_LINES + 1):
        for line in sorted({site.line - distance, site.line + distance}):
            if 0 < line <= len(lines) and _asserts(wanted, lines, line):
                return line
    return None


def _asserts(wanted: re.Pattern[str], lines: list[str], line: int) -> bool:
    """An assertion macro with the wanted condition starts on this line (its condition may wrap onto the next
    lines, between comments: intrusive_ptr.h's destructor asserts after ten lines of them)."""
    first = _squeeze(_COMMENT.sub("", lines[line - 1]))
    text = first + _squeeze(" ".join(_COMMENT.sub("", text) for text in lines[line:line + _WRAPPED_LINES]))
    return any(match.start() < len(first) for match in wanted.finditer(text))


def _squeeze(text: str) -> str:
    """Without whitespace: the stringized condition and the header's (possibly wrapped) text compare equal."""
    return re.sub(r"\s+", "", text)


def _assertion_sites(binary: Path) -> set[_Site]:
    sites: set[_Site] = set()
    try:
        with open(binary, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for match in _ASSERTION_SITE.finditer(data, 0, min(len(data), MAX_SCANNED_BYTES)):
                header = _HEADER_ROOT.search(match.group(1).decode("latin-1"))
                if header is not None:
                    sites.add(_Site(header.group(1), int(match.group(2)), _condition(data, match.start())))
                    if len(sites) >= MAX_SITES:
                        break
    except (OSError, ValueError):
        return set()  # empty or unreadable: the symbol check has already read (or refused) the file
    return sites


def _condition(data: mmap.mmap, end: int) -> str:
    """The text of the string before ` INTERNAL ASSERT FAILED` (the stringized condition), "" when there is none
    or it is longer than MAX_CONDITION (its start is not known)."""
    start = data.rfind(b"\x00", max(0, end - MAX_CONDITION), end)
    if start < 0 and end > MAX_CONDITION:
        return ""
    text = data[start + 1:end]
    return text[:-1].decode("latin-1") if text.endswith(b" ") else ""


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
