"""Read the libstdc++ dual ABI of torch / torch_xla binaries and predict `undefined symbol` import failures.

Users meet ABI trouble as `ImportError: ... undefined symbol: _ZN5torch4lazy13MetricFnValueB5cxx11E...` when
torch_xla, a custom extension or a plugin was compiled with the other `_GLIBCXX_USE_CXX11_ABI` than the torch
beside it. Two questions answer it, both from the ELF dynamic symbol tables alone (nothing is imported or run):

* ``inspect``: which ABI does each shared object of a wheel, a directory or an image use, and which GLIBC /
  GLIBCXX versions does it need?  (`inspect_path`, `inspect_image`, `classify_shared_object`)
* ``check``: do the undefined C++ symbols of torch_xla's ``_XLAC*.so`` and of every other extension linking torch
  resolve against what the torch libraries export?  (`check_site_packages`, `check_image`)

How a symbol shows its ABI (Itanium mangling as GCC emits it):

* cxx11: the namespace ``std::__cxx11`` (``NSt7__cxx11...``) or the ``[abi:cxx11]`` tag (``B5cxx11``) that GCC
  adds to names whose return or variable type is a C++11 string/list.
* pre-cxx11: ``std::string`` spelt ``Ss``, ``std::basic_string`` spelt ``Sb``, or ``std::list`` and the
  string-stream classes directly under ``St`` (old ABI), e.g. undefined references to ``_ZNSs...``.

A shared object is cxx11, pre-cxx11, ``none`` (no string in its interface) or ``mixed`` (both); see
`SharedObjectReport` for why names in namespace std only count when nothing else shows an ABI. A package
(wheel, directory, image site-packages) is cxx11 when all its string-using objects are, and so on; bundled
libstdc++/libgcc copies are reported but left out. `check` calls a missing symbol an ``abi mismatch`` when torch
exports its twin under the other ABI (see `abi_neutral_key`), else a ``version mismatch``.

``--json`` prints one object for a path and an array (one per site-packages) for an image:
``{"path", "kind", "abi", "platform_tag", "verdict", "glibc", "glibcxx", "shared_objects": [{"path", "abi",
"glibc", "glibcxx", "cxx11_symbols", "pre_cxx11_symbols", "abi_basis", "bundled_runtime"}]}`` for inspect, and
``{"path", "verdict", "summary", "torch_abi", "torch_version", "needs_cuda_unavailable", "torch_libraries",
"extensions": [{"path", "abi", "verdict", "torch_symbols", "missing": [{"symbol", "demangled", "problem", "twin",
"twin_demangled"}], "from_cuda_stub", "distribution", "requires_torch", "registers_operators"}]}`` for check.

WHAT SYMBOLS CANNOT SHOW. An extension compiled against another torch release may resolve every symbol and still
crash (torchvision 0.23.0 beside torch 2.9.0: SIGSEGV while registering its operators). `check` therefore also
calls an extension a ``version mismatch`` when the distribution that installed it pins another torch release
(``Requires-Dist: torch==X``), and says "runtime operator compatibility not checkable" for extensions that
register operators without such a pin (see `_with_distribution`, `_operators_remark`).

HOSTILE INPUT. Corrupt ELF files (`CorruptElf`), damaged wheels, zip bombs, unreadable paths and symlink loops are
usage errors naming the file and a rule (RULE_ELF, RULE_WHEEL, RULE_PATH); reading is bounded by the input's size
(`_open_elf`, `_read_version_needs`, `_check_member_size`).

STANDALONE USE. This module imports only the standard library and pyelftools at top level, so the wheel build
script can copy this one file into a build container and run ``python abi.py inspect|check PATH [--json]``
(or ``python -m xla_images.abi ...`` where the package is installed). Other xla_images modules (errors, engine)
are imported lazily inside the functions that need them; without them usage errors are `AbiUsageError` and
the exit codes stay the same: 0 fine, 1 ABI/version mismatch, 2 usage error. Keep it one file for that reason.

The ABI names ("cxx11", "pre-cxx11") are the values of `xla_images.model.flavour.Abi`; this module cannot import it.
"""
from __future__ import annotations

import argparse
import csv
import errno
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

from elftools.common.utils import struct_parse
from elftools.elf.elffile import ELFFile

CXX11 = "cxx11"
PRE_CXX11 = "pre-cxx11"
NO_STRINGS = "none"
MIXED = "mixed"

COMPATIBLE = "compatible"
ABI_MISMATCH = "abi mismatch"
VERSION_MISMATCH = "version mismatch"
# A symbol torch does not export that torch_xla's CUDA stand-in provides: fine only while CUDA is unavailable.
FROM_CUDA_STUB = "from cuda stub"

# torch_xla (2.7+) loads this extension RTLD_GLOBAL before _XLAC whenever torch.cuda.is_available() is False, so
# _XLAC can bind c10::cuda symbols that the torch beside it lacks (torch_xla 2.8 needs c10::cuda::set_device(signed
# char), which torch 2.8 no longer exports). Where torch sees a GPU the stub is not loaded and the import fails
# (pytorch/xla#9656).
CUDA_STUB_PREFIX = "_XLAC_cuda_functions"

# Where images keep the python packages, searched in this order without running anything in the image.
SITE_PACKAGES_GLOBS: tuple[str, ...] = (
    "/opt/venv/lib/python3.*/site-packages",
    "/usr/local/lib/python3.*/site-packages",
    "/usr/lib/python3/dist-packages",
)

# Undefined symbols naming these namespaces must come from torch; anything else may come from system libraries.
TORCH_NAMESPACES: tuple[str, ...] = ("torch", "c10", "at", "caffe2")

# Members bigger than this are unpacked to a temporary file instead of memory when reading a wheel.
IN_MEMORY_LIMIT = 256 << 20
# Bounds on what one wheel member may cost. The biggest real member seen is torch 2.8's libtorch_cuda.so (1.0 GB,
# 3.4x compressed); the best compressed members of real torch wheels are headers at 25x, shared objects 3-6x.
MAX_MEMBER_BYTES = 4 << 30
BOMB_RATIO, BOMB_MIN_BYTES = 200, 16 << 20
MAX_METADATA_BYTES = 16 << 20  # WHEEL, METADATA, RECORD

ELF_MAGIC = b"\x7fELF"
_SHARED_OBJECT_NAME = re.compile(r"\.so(?:\.[0-9]+)*$")

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


class AbiUsageError(ValueError):
    """Bad input when xla_images.errors is not importable (standalone use). Exit code 2."""

    exit_code = 2


def _usage_error(message: str, hint: str | None = None, rule: str = "abi-input") -> Exception:
    """A ConfigError when running inside xla_images, else a plain AbiUsageError with the same text."""
    try:
        from xla_images.errors import ConfigError
    except ImportError:
        text = f"error [{rule}]: {message}"
        return AbiUsageError(text if hint is None else f"{text}\n  hint: {hint}")
    return ConfigError(message, rule=rule, hint=hint)


# Rules named by the usage errors about unreadable inputs.
RULE_ELF = "abi-elf-readable"
RULE_WHEEL = "abi-wheel-readable"
RULE_PATH = "abi-path-readable"


class CorruptElf(ValueError):
    """An ELF file whose headers or dynamic tables do not hold together (the dynamic linker would refuse it too).

    Raised by `read_elf_dynamic` for every problem in the bytes, whatever pyelftools raised; callers that know
    the file's name turn it into a usage error (`_unreadable_elf`)."""


def _unreadable_elf(display: str, error: CorruptElf) -> Exception:
    return _usage_error(f"{display} is not a readable ELF shared object: {error}", rule=RULE_ELF,
                        hint="the file is truncated or corrupt: reinstall the package it belongs to")


# --------------------------------------------------------------------------------------------------------------
# Reading the dynamic symbol table
# --------------------------------------------------------------------------------------------------------------

_SHN_UNDEF = 0
_STB_LOCAL, _STB_WEAK = 0, 2
_STV_DEFAULT, _STV_PROTECTED = 0, 3
_VERSYM_HIDDEN = 0x8000


@dataclass(frozen=True)
class UndefinedSymbol:
    """A symbol an object expects another library to provide."""

    name: str
    weak: bool
    # Set when the reference is bound to a versioned library (libstdc++.so.6 GLIBCXX_3.4.21, libc.so.6 ...).
    version_file: str | None = None
    version: str | None = None


@dataclass
class ElfDynamic:
    """What the dynamic linker sees of one shared object."""

    defined: set[str] = field(default_factory=set)
    undefined: list[UndefinedSymbol] = field(default_factory=list)
    needed: tuple[str, ...] = ()
    search_path: tuple[str, ...] = ()  # DT_RUNPATH, else DT_RPATH, split on ':'
    soname: str | None = None
    version_needs: dict[str, tuple[str, ...]] = field(default_factory=dict)


def read_elf_dynamic(stream: IO[bytes]) -> ElfDynamic:
    """Parse dynsym, versions and DT_NEEDED of an ELF stream; CorruptElf when the bytes do not hold together.

    pyelftools locates and decodes the sections; the symbol entries themselves are unpacked with `struct`
    because pyelftools' per-symbol objects cost ~55 us each and torch libraries export hundreds of thousands.
    Every loop is bounded by the stream's size (see `_open_elf`), so hostile headers cannot make it hang.
    """
    with _corrupt_elf_errors():
        return _read_elf_dynamic(stream)


@contextmanager
def _corrupt_elf_errors() -> Iterator[None]:
    """Any exception while decoding ELF bytes means the bytes are bad: pyelftools raises ELFError, construct's
    StreamError, struct.error, IndexError, KeyError, ValueError... depending on which field is broken."""
    try:
        yield
    except CorruptElf:
        raise
    except MemoryError:
        raise CorruptElf("a table is too large to read") from None
    except Exception as error:  # noqa: BLE001 - a parser boundary: whatever the third-party parser raised
        reason = f"{type(error).__name__}: {error}".strip().rstrip(":")
        raise CorruptElf(reason if len(reason) <= 200 else reason[:200] + "...") from None


def _open_elf(stream: IO[bytes]) -> ELFFile:
    """ELFFile after checking that the section header table lies inside the stream.

    pyelftools trusts e_shnum (or, when it is 0, the sh_size of section 0: up to 2**64) and e_shentsize; the
    check bounds every later loop over sections by the file size."""
    if stream.read(4) != ELF_MAGIC:
        raise CorruptElf("no ELF magic")
    stream.seek(0, os.SEEK_END)
    size = stream.tell()
    stream.seek(0)
    elf = ELFFile(stream)
    if elf["e_shoff"] == 0:
        return elf
    entry = elf.structs.Elf_Shdr.sizeof()
    if elf["e_shentsize"] != entry:
        raise CorruptElf(f"section header size {elf['e_shentsize']}, expected {entry}")
    count = elf.num_sections()
    if elf["e_shoff"] + count * entry > size:
        raise CorruptElf(f"{count} section headers at offset {elf['e_shoff']} run past the end of the file "
                         f"({size} bytes): truncated?")
    return elf


# The biggest dynamic tables of real torch libraries are tens of MB (libtorch_cuda.so's .dynstr); a sparse file or
# a lying sh_size must not make one read allocate gigabytes.
MAX_TABLE_BYTES = 512 << 20


def _section_data(section) -> bytes:
    if section["sh_size"] > MAX_TABLE_BYTES:
        raise CorruptElf(f"section {section.name!r} claims {section['sh_size']} bytes (more than {MAX_TABLE_BYTES})")
    return section.data()


def _read_elf_dynamic(stream: IO[bytes]) -> ElfDynamic:
    elf = _open_elf(stream)
    sections = _sections_by_type(elf, ("SHT_DYNAMIC", "SHT_GNU_verneed", "SHT_DYNSYM", "SHT_GNU_versym"))
    info = ElfDynamic()
    dynamic = sections.get("SHT_DYNAMIC")
    if dynamic is not None:
        _read_dynamic_tags(dynamic, info)
    version_index = _read_version_needs(sections.get("SHT_GNU_verneed"), info)
    dynsym = sections.get("SHT_DYNSYM")
    if dynsym is None:
        return info  # a static or sstripped object: nothing the dynamic linker would resolve by name
    strings = _section_data(elf.get_section(dynsym["sh_link"]))
    versym = _read_versym(sections.get("SHT_GNU_versym"), elf.little_endian)
    _read_symbols(_section_data(dynsym), strings, versym, version_index, elf, info)
    return info


def _sections_by_type(elf: ELFFile, wanted: Sequence[str]) -> dict:
    """The first section of each wanted type. Only headers are parsed for the others: building every section
    object (ELFFile.iter_sections) decodes the whole .gnu.hash table, over a second for torch libraries."""
    found = {}
    for index in range(elf.num_sections()):
        header = struct_parse(elf.structs.Elf_Shdr, elf.stream,
                              stream_pos=elf["e_shoff"] + index * elf["e_shentsize"])
        if header["sh_type"] in wanted and header["sh_type"] not in found:
            found[header["sh_type"]] = elf.get_section(index)
    return found


def _read_dynamic_tags(dynamic, info: ElfDynamic) -> None:
    needed: list[str] = []
    runpath: list[str] = []
    rpath: list[str] = []
    for tag in dynamic.iter_tags():
        kind = tag.entry.d_tag
        if kind == "DT_NEEDED":
            needed.append(tag.needed)
        elif kind == "DT_RUNPATH":
            runpath.extend(tag.runpath.split(":"))
        elif kind == "DT_RPATH":
            rpath.extend(tag.rpath.split(":"))
        elif kind == "DT_SONAME":
            info.soname = tag.soname
    info.needed = tuple(needed)
    # The loader ignores DT_RPATH when DT_RUNPATH is present.
    info.search_path = tuple(entry for entry in (runpath or rpath) if entry)


def _read_version_needs(verneed, info: ElfDynamic) -> dict[int, tuple[str, str]]:
    """Map version index -> (library file, version name) and record every version each library must offer.

    pyelftools follows vn_next / vna_next for sh_info entries (up to 2**32) and vn_cnt auxiliaries each; a
    zero `next` revisits one entry forever. Real tables hold at most sh_size / 16 records of 16 bytes."""
    index: dict[int, tuple[str, str]] = {}
    if verneed is None:
        return index
    budget = verneed["sh_size"] // 16
    if verneed.num_versions() > budget:
        raise CorruptElf(f"version needs claim {verneed.num_versions()} entries in {verneed['sh_size']} bytes")
    needs: dict[str, list[str]] = {}
    for entry, auxiliaries in verneed.iter_versions():
        budget -= 1
        if entry["vn_cnt"] > budget:
            raise CorruptElf(f"version needs of {entry.name!r} claim {entry['vn_cnt']} versions beyond the table")
        for aux in auxiliaries:
            budget -= 1
            index[aux["vna_other"]] = (entry.name, aux.name)
            needs.setdefault(entry.name, []).append(aux.name)
    info.version_needs = {name: tuple(versions) for name, versions in needs.items()}
    return index


def _read_versym(versym, little_endian: bool) -> Sequence[int] | None:
    if versym is None:
        return None
    data = _section_data(versym)
    return struct.unpack(f"{'<' if little_endian else '>'}{len(data) // 2}H", data)


def _read_symbols(data: bytes, strings: bytes, versym: Sequence[int] | None,
                  version_index: dict[int, tuple[str, str]], elf: ELFFile, info: ElfDynamic) -> None:
    endian = "<" if elf.little_endian else ">"
    layout = f"{endian}IBBHQQ" if elf.elfclass == 64 else f"{endian}IIIBBH"
    size = struct.calcsize(layout)
    entries = struct.iter_unpack(layout, data[:len(data) - len(data) % size])
    if elf.elfclass != 64:  # Elf32_Sym orders its fields differently
        entries = ((name, st_info, other, shndx, value, value) for name, value, _, st_info, other, shndx in entries)
    text = strings.decode("latin-1")  # mangled names are ASCII; latin-1 never fails
    find = text.find
    define = info.defined.add
    undefined = info.undefined.append
    for position, (name_offset, st_info, other, shndx, _, _) in enumerate(entries):
        binding = st_info >> 4
        if binding == _STB_LOCAL or name_offset == 0 or position == 0:
            continue
        name = text[name_offset:find("\0", name_offset)]
        if shndx == _SHN_UNDEF:
            version = version_index.get(versym[position] & ~_VERSYM_HIDDEN) if versym is not None else None
            undefined(UndefinedSymbol(name, binding == _STB_WEAK, *(version or (None, None))))
        elif other & 3 in (_STV_DEFAULT, _STV_PROTECTED):
            define(name)


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == ELF_MAGIC
    except OSError:
        return False


def has_elf_magic(path: Path, display: str | None = None) -> bool:
    """Like is_elf, but a file that cannot be read is a usage error, never silently skipped: a verdict
    over a site-packages with unreadable libraries would be a guess."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == ELF_MAGIC
    except OSError as error:
        raise _unreadable_path(display or str(path), error) from None


def _unreadable_path(display: str, error: OSError) -> Exception:
    return _usage_error(f"cannot read {display}: {error.strerror or error}", rule=RULE_PATH,
                        hint="check its permissions (run as a user who can read the whole tree)")


def read_elf_file(path: Path, display: str | None = None) -> ElfDynamic:
    """read_elf_dynamic of a file; unreadable or corrupt files are usage errors naming display (or path)."""
    try:
        with open(path, "rb") as handle:
            return read_elf_dynamic(handle)
    except CorruptElf as error:
        raise _unreadable_elf(display or str(path), error) from None
    except OSError as error:
        raise _unreadable_path(display or str(path), error) from None


# --------------------------------------------------------------------------------------------------------------
# Which ABI does a mangled name use?
# --------------------------------------------------------------------------------------------------------------

# Cheap pre-filters: most symbols match neither, and only old-ABI hints need the careful scan below because
# `Ss`/`Sb` also occur inside ordinary identifiers (`isSslEnabled`).
_OLD_ABI_HINT = re.compile(
    r"S[sb]|St(?:4list|10_List_base|12basic_string|15basic_stringbuf|18basic_stringstream|19basic_[io]stringstream)"
)
_NEW_ABI_HINT = re.compile(r"7__cxx11|B5cxx11")
# Classes the dual ABI duplicated: without `__cxx11` right under `std` they are the old ones.
_OLD_ABI_STD_CLASSES = frozenset({
    "list", "_List_base", "basic_string", "basic_stringbuf", "basic_stringstream", "basic_istringstream",
    "basic_ostringstream",
})
_SUBSTITUTION = re.compile(r"S[0-9A-Z]*_")
_DIGITS = re.compile(r"[0-9]+")
_MAX_LENGTH_DIGITS = 9  # an identifier of 10**9 characters or more is not a real symbol
_LAMBDA_END = re.compile(r"E[0-9]*_")
# Productions in which digits are NOT the length of a following identifier.
_NON_NAME = re.compile(r"""
      T_ | T[0-9]+_ | TL[0-9]*__[0-9]*_                  # template parameters
    | Thn?[0-9]+_ | Tvn?[0-9]+_n?[0-9]+_                 # thunk offsets
    | Tc(?:hn?[0-9]+_|vn?[0-9]+_n?[0-9]+_){2}
    | T[A-Za-z] | G[VRT]                                 # special names: TV TI TS TT ... guard variables
    | L_Z | L(?:[a-z]|D[a-zA-Z])n?[0-9a-fA-F.]*E          # literals: Li5E, Lb1E, external names
    | A[0-9]*_                                           # array bounds
    | _[0-9] | __[0-9]+_                                 # discriminators
    | CI?[1-5] | D[0-5]                                  # constructors, destructors
    | D[vFBU][0-9]+_?                                    # vectors, _FloatN, _BitInt
    | Ut[0-9]*_                                          # unnamed types
    | fp[rVK]*[0-9]*_ | fL[0-9]+p[rVK]*[0-9]*_           # function parameter references
""", re.VERBOSE)


def symbol_abi(name: str) -> tuple[bool, bool]:
    """(uses the C++11 ABI, uses the pre-C++11 ABI) for one symbol name; both False when it shows neither."""
    if not name.startswith("_Z"):
        return False, False
    if _OLD_ABI_HINT.search(name) is None:
        return _NEW_ABI_HINT.search(name) is not None, False
    return _scan_mangled(name)


def count_abi_symbols(names: Iterable[str]) -> tuple[int, int]:
    """(names using the C++11 ABI, names using the pre-C++11 ABI); a name showing both counts in both.

    Same rules as `symbol_abi`, but the pre-filters run once over all names joined by newlines (C speed) and
    only the lines they hit are looked at in Python: libraries have up to ~400k dynamic symbols.
    """
    text = "\n".join(names)
    new_lines = _hit_lines(_NEW_ABI_HINT, text)
    cxx11, pre_cxx11 = len(new_lines), 0
    for start, end in _hit_lines(_OLD_ABI_HINT, text).items():
        new, old = _scan_mangled(text[start:end])
        cxx11 += new - (start in new_lines)
        pre_cxx11 += old
    return cxx11, pre_cxx11


def _hit_lines(pattern: re.Pattern[str], text: str) -> dict[int, int]:
    """{start: end} of the lines of text that start with `_Z` and contain a match of pattern."""
    lines: dict[int, int] = {}
    next_line = 0  # matches come in order: skip the rest of a line already taken
    for match in pattern.finditer(text):
        if match.start() < next_line:
            continue
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        next_line = len(text) if end < 0 else end
        if text.startswith("_Z", start):
            lines[start] = next_line
    return lines


def _scan_mangled(name: str) -> tuple[bool, bool]:
    """Walk a mangled name token by token, skipping identifiers, and note the ABI markers it carries.

    Not a demangler: it only needs to know where identifiers start and end (`<length><chars>`) so that letters
    inside them are never read as grammar, and to recognise the std abbreviations and abi tags.
    """
    new = old = False
    position, end = 2, len(name)
    after_std = after_tag = False
    lambdas = 0
    while position < end:
        char = name[position]
        if char.isdigit():
            start = position
            while position < end and name[position].isdigit():
                position += 1
            # More digits than the name has characters cannot be a length (and int() refuses > 4300 digits).
            length = int(name[start:position]) if position - start <= _MAX_LENGTH_DIGITS else 0
            if 0 < length <= end - position:
                identifier = name[position:position + length]
                if identifier == "__cxx11" or (after_tag and identifier == "cxx11"):
                    new = True
                elif after_std and identifier in _OLD_ABI_STD_CLASSES:
                    old = True
                position += length
            after_std = after_tag = False
            continue
        next_after_std = next_after_tag = False
        following = name[position + 1] if position + 1 < end else ""
        if char == "S" and following in ("s", "b"):
            old = True
            position += 2
        elif char == "S" and following == "t":
            position += 2
            next_after_std = True
        elif char == "S" and following in ("a", "i", "o", "d"):
            position += 2
        elif char == "S":
            match = _SUBSTITUTION.match(name, position)
            position = match.end() if match else position + 1
        elif char == "B" and following.isdigit():
            position += 1
            next_after_tag = True
        elif char == "U" and following == "l":
            lambdas += 1
            position += 2
        elif char == "E" and lambdas and (match := _LAMBDA_END.match(name, position)):
            lambdas -= 1
            position = match.end()
        elif char == ".":
            break  # clone suffixes (.isra.0, .cold) carry no ABI
        else:
            match = _NON_NAME.match(name, position)
            position = match.end() if match else position + 1
        after_std, after_tag = next_after_std, next_after_tag
    return new, old


# The C++11 std::string spelt out; std::__cxx11 and the parts may be back-references to earlier mentions.
_CXX11_STRING = re.compile(
    r"N(?:St7__cxx11|S[0-9A-Z]*_)12basic_stringIc(?:St11char_traitsIcE|S[0-9A-Z]*_)(?:SaIcE|S[0-9A-Z]*_)EE"
)
# After rewriting, what differs between the two manglings is only back-reference numbering (the C++11 spelling
# adds substitution candidates) and whether char_traits/allocator were spelt or referenced, so all collapse.
_COLLAPSE = re.compile(r"SaIcE|St11char_traitsIcE|Ss|S[0-9A-Z]*_")


def abi_neutral_key(name: str) -> str:
    """A key equal for a symbol and its twin under the other ABI.

    Rewrites `NSt7__cxx1112basic_string<char...>` to `Ss` and a standalone `NSt7__cxx114listI..EE` to
    `St4listI..E`, drops other `__cxx11` namespaces and `[abi:cxx11]` tags, then collapses back-references.
    Lossy on purpose: it only serves to find, for a symbol that is missing, an exported symbol that differs
    from it by ABI, and `_TwinIndex.find` additionally requires their ABI markers to differ.
    """
    key = _CXX11_STRING.sub("Ss", name)
    key = _unnest_cxx11_classes(key)
    key = key.replace("7__cxx11", "").replace("B5cxx11", "")
    return _COLLAPSE.sub("S_", key)


_NESTED_CXX11_CLASS = re.compile(r"NSt7__cxx11([0-9]+)")
_TEMPLATE_OPENERS = frozenset("NIFXJ")
_LITERAL = re.compile(r"L(?:[a-z]|D[a-zA-Z])n?[0-9a-fA-F.]*E")


def _unnest_cxx11_classes(name: str) -> str:
    """`NSt7__cxx114listIiSaIiEEE` (std::__cxx11::list<int> as a whole type) -> `St4listIiSaIiEE`, the old
    spelling of std::list<int>; members (`NSt7__cxx114listIiSaIiEE5clearEv`) keep their N..E and only lose the
    namespace later, exactly as the old ABI spells them."""
    position = 0
    while (match := _NESTED_CXX11_CLASS.search(name, position)) is not None:
        after_name = match.end() + int(match.group(1))
        close = _skip_template_args(name, after_name) if name.startswith("I", after_name) else after_name
        if close is not None and name.startswith("E", close):
            name = f"{name[:match.start()]}St{name[match.start(1):close]}{name[close + 1:]}"
        position = match.start() + 1
    return name


def _skip_template_args(name: str, start: int) -> int | None:
    """Index just past the `E` closing the template arguments that open at name[start] == 'I'; None if lost."""
    depth, position = 0, start
    while position < len(name):
        char = name[position]
        if char.isdigit():
            digits = _DIGITS.match(name, position).group()
            if len(digits) > _MAX_LENGTH_DIGITS:
                return None
            position += len(digits) + int(digits)
            continue
        literal = _LITERAL.match(name, position) if char == "L" else None
        substitution = _SUBSTITUTION.match(name, position) if char == "S" else None
        if literal or substitution:
            position = (literal or substitution).end()
            continue
        if char in _TEMPLATE_OPENERS:
            depth += 1
        elif char == "E":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return None


# A nested name (after optional cv/ref qualifiers) whose first component is one of TORCH_NAMESPACES.
_TORCH_NAMESPACE = re.compile(r"N[rVKRO]*(?:" + "|".join(f"{len(name)}{name}" for name in TORCH_NAMESPACES) + ")")


def names_torch_namespace(name: str) -> bool:
    """Does the mangled name mention torch::, c10::, at:: or caffe2:: (as itself or in its arguments)?"""
    return _TORCH_NAMESPACE.search(name) is not None


# The entity itself (not an argument) is in a torch namespace: `_ZNK3c1010TensorImpl...`, vtables `_ZTVN3c10...`,
# function-local statics `_ZZN2at...`, ref-qualified members `_ZNR5torch7Library...`.
_TORCH_ENTITY = re.compile(r"_Z(?:T[VTIS]|GV|GR|Thn?[0-9]+_|Tvn?[0-9]+_n?[0-9]+_)?Z?" + _TORCH_NAMESPACE.pattern)


def is_torch_entity(name: str) -> bool:
    """Is the symbol something torch defines? `torchaudio::sox::save_audio_file(at::Tensor, ...)` names at::
    in its arguments only: a sibling library of torchaudio defines it, and torch's absence of it says nothing."""
    return _TORCH_ENTITY.match(name) is not None


# References that register operators with torch's dispatcher (TORCH_LIBRARY / TORCH_LIBRARY_IMPL, RegisterOperators).
_REGISTERS_OPERATORS = re.compile(r"_ZN[rVKRO]*(?:5torch7Library|3c1017RegisterOperators)")


# --------------------------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------------------------


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
        raise _usage_error(f"{path} is not an ELF shared object", hint="pass a .so file, a wheel or a directory",
                           rule=RULE_ELF)
    return classify_dynamic(read_elf_file(path), str(path))


def _all_names(info: ElfDynamic) -> Iterator[str]:
    yield from info.defined
    for symbol in info.undefined:
        yield symbol.name


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
        return _inspect_directory(path, kind="directory", display=str(path))
    if path.is_file() and path.suffix == ".whl":
        return _inspect_wheel(path)
    if path.is_file() and has_elf_magic(path):
        report = classify_shared_object(path)
        return _package("file", str(path), (report,), platform_tag=None, version=None)
    if path.exists():
        raise _usage_error(f"{path} is neither a wheel, a directory nor an ELF shared object",
                           hint="pass a .whl file, a site-packages directory, a .so file or an image reference")
    raise missing_path_error(path, "check the path, or pass an image reference")


def missing_path_error(path: Path, hint: str) -> Exception:
    """'does not exist', saying why when path is a symlink: a loop, or pointing nowhere."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:
            return _usage_error(f"{path} does not exist: it is a symlink loop", hint=hint, rule=RULE_PATH)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return _usage_error(f"{path} does not exist: it is a symlink loop", hint=hint, rule=RULE_PATH)
        return _usage_error(f"{path} does not exist: it is a dangling symlink to {os.readlink(path)}", hint=hint,
                            rule=RULE_PATH)
    return _usage_error(f"{path} does not exist", hint=hint, rule=RULE_PATH)


def inspect_image(image: str) -> list[PackageReport]:
    """Inspect every python site-packages of an image (see SITE_PACKAGES_GLOBS) without running the image."""
    with tempfile.TemporaryDirectory(prefix="xla-images-abi-") as scratch:
        return [
            _inspect_directory(local, kind="image", display=f"{image}:{inside}")
            for inside, local in _extract_site_packages(image, Path(scratch))
        ]


def inspect_target(target: str) -> list[PackageReport]:
    """The CLI's argument: an existing path, else an image reference."""
    if is_path_target(target):
        return [inspect_path(Path(target).expanduser())]
    return inspect_image(target)


def is_path_target(target: str) -> bool:
    """Is the CLI argument a path (one report: a JSON object) rather than an image (a JSON array)?

    Existing paths, and things that can only be meant as paths, so a typo is reported, not looked up as an image.
    """
    return os.path.exists(target) or target.endswith((".whl", ".so")) or target.startswith(("/", ".", "~"))


def _inspect_directory(root: Path, *, kind: str, display: str) -> PackageReport:
    reports = []
    for relative, full in walk_shared_objects(root):
        reports.append(classify_dynamic(read_elf_file(full, os.path.join(display, relative)), relative))
    return _package(kind, display, tuple(reports), platform_tag=None, version=None)


def walk_shared_objects(root: Path) -> Iterator[tuple[str, Path]]:
    """(path relative to root, path) of each ELF shared object under root, following symlinks once.

    Iterative (os.walk recurses once per level in python 3.11: a deep tree would end in RecursionError), and a
    directory or library that cannot be read is a usage error: skipping it would give a verdict on part of
    the tree. Symlinks that loop or point nowhere are what the loader would not find either: skipped."""
    # Files and directories are known by (device, inode) after following symlinks: os.path.realpath costs one
    # lstat per path component, quadratic in a deep tree.
    seen: set[tuple[int, int]] = set()
    pending = [(str(root), "")]
    while pending:
        directory, relative = pending.pop()
        try:
            identity = os.stat(directory)
        except OSError:
            continue  # vanished, or a symlink loop: nothing the loader would find there either
        if (identity.st_dev, identity.st_ino) in seen:
            continue
        seen.add((identity.st_dev, identity.st_ino))
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            raise _unreadable_path(directory, error) from None
        subdirectories = []
        for entry in entries:
            inside = f"{relative}{entry.name}"
            if _is_directory(entry):
                subdirectories.append((entry.path, inside + "/"))
                continue
            if not _SHARED_OBJECT_NAME.search(entry.name):
                continue
            try:
                target = entry.stat()  # follows symlinks
            except OSError:
                continue  # a dangling symlink or a loop
            if not stat.S_ISREG(target.st_mode) or (target.st_dev, target.st_ino) in seen:
                continue
            if not has_elf_magic(Path(entry.path)):
                continue
            seen.add((target.st_dev, target.st_ino))
            yield inside, Path(entry.path)
        pending.extend(reversed(subdirectories))  # depth first, in name order


def _is_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks; False for loops and dangling ones
    except OSError:
        return False


def _inspect_wheel(path: Path) -> PackageReport:
    try:
        archive = zipfile.ZipFile(path)
    except OSError as error:
        raise _unreadable_path(str(path), error) from None
    except Exception as error:  # noqa: BLE001 - BadZipFile, ValueError, EOFError ... for a damaged archive
        raise _usage_error(f"{path} is not a readable wheel (zip): {_reason(error)}", rule=RULE_WHEEL,
                           hint="download it again: the file is truncated or not a zip archive") from None
    with archive:
        reports = tuple(
            classify_dynamic(_read_member(path, archive, member), member.filename)
            for member in archive.infolist()
            if _SHARED_OBJECT_NAME.search(member.filename) and _member_is_elf(path, archive, member)
        )
        tags = _wheel_file_tags(path, archive)
    filename = _WHEEL_FILENAME.match(path.name)
    platform_tag = filename.group("platform") if filename else (".".join(tags) or None)
    version = filename.group("version") if filename else None
    return _package("wheel", str(path), reports, platform_tag=platform_tag, version=version)


def _reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    return text if len(text) <= 200 else text[:200] + "..."


@contextmanager
def _member_errors(wheel: Path, member: zipfile.ZipInfo) -> Iterator[None]:
    """A member that cannot be decompressed (bad CRC, truncated data, encrypted, unknown method) names itself."""
    try:
        yield
    except CorruptElf as error:
        raise _unreadable_elf(f"{wheel}!{member.filename}", error) from None
    except OSError as error:  # the wheel itself became unreadable, or the spool's disk is full
        raise _usage_error(f"cannot read {wheel}!{member.filename}: {error.strerror or error}",
                           rule=RULE_PATH) from None
    except Exception as error:  # noqa: BLE001 - zipfile/zlib raise BadZipFile, zlib.error, EOFError, RuntimeError...
        raise _usage_error(f"{wheel}!{member.filename} cannot be decompressed: {_reason(error)}", rule=RULE_WHEEL,
                           hint="download the wheel again: it is truncated or corrupt") from None


def _check_member_size(wheel: Path, member: zipfile.ZipInfo, limit: int | None = None) -> None:
    """Refuse members whose declared size is beyond any real library, or that inflate like a zip bomb.

    zipfile never inflates past the declared file_size (a liar fails its CRC), so these two bounds bound
    the time, memory and disk a member can cost."""
    limit = MAX_MEMBER_BYTES if limit is None else limit
    if member.file_size > limit:
        raise _usage_error(f"{wheel}!{member.filename} declares {member.file_size} bytes uncompressed, more than "
                           f"the {limit} bytes allowed", rule=RULE_WHEEL,
                           hint="no real shared object is that large: the wheel is corrupt or hostile")
    if member.file_size > BOMB_MIN_BYTES and member.file_size > BOMB_RATIO * max(member.compress_size, 1):
        raise _usage_error(f"{wheel}!{member.filename} inflates {member.compress_size} bytes to {member.file_size} "
                           f"(more than {BOMB_RATIO}x): a zip bomb, not a shared object", rule=RULE_WHEEL,
                           hint="real shared objects compress 3-6x; the wheel is corrupt or hostile")


def _member_is_elf(wheel: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> bool:
    with _member_errors(wheel, member), archive.open(member) as handle:
        return handle.read(4) == ELF_MAGIC


def _read_member(wheel: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> ElfDynamic:
    """Decompress one member (to memory, or a temp file when big) and read it: pyelftools must seek."""
    _check_member_size(wheel, member)
    with _member_errors(wheel, member):
        if member.file_size <= IN_MEMORY_LIMIT:
            return read_elf_dynamic(io.BytesIO(archive.read(member)))
        with tempfile.TemporaryFile() as spool, archive.open(member) as source:
            shutil.copyfileobj(source, spool, 1 << 22)
            spool.seek(0)
            return read_elf_dynamic(spool)


def _wheel_file_tags(wheel: Path, archive: zipfile.ZipFile) -> list[str]:
    """Platform parts of the `Tag:` lines of the .dist-info/WHEEL file."""
    for member in archive.infolist():
        name = member.filename
        if name.count("/") == 1 and name.endswith(".dist-info/WHEEL"):
            _check_member_size(wheel, member, MAX_METADATA_BYTES)
            with _member_errors(wheel, member):
                text = archive.read(member).decode("utf-8", "replace")
            tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
            return sorted({tag.rsplit("-", 1)[-1] for tag in tags})
    return []


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
                parts.append(f"{kind} in {_some(names)}")
        text = "MIXED ABI: " + "; ".join(parts) + " - its libraries were built with different ABIs"
    else:
        users = sum(report.abi != NO_STRINGS for report in own)
        text = f"{_ABI_WORDS[abi]}, {users} of {len(own)} shared objects use std::string"
    ignored = [f"{os.path.basename(report.path)} ({report.abi}, from {report.abi_basis})" for report in own
               if report.abi not in (abi, NO_STRINGS) and report not in deciding]
    if ignored:
        text += f"; not counted: {_some(ignored)}"
    needs = [f"GLIBC {glibc}" if glibc else "", f"GLIBCXX {glibcxx}" if glibcxx else ""]
    if any(needs):
        text += "; needs " + ", ".join(need for need in needs if need)
    text += _tag_remark(glibc, platform_tag)
    text += _label_remark(abi, version)
    return text


def _some(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


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


# --------------------------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MissingSymbol:
    """An undefined symbol of an extension that the torch beside it does not export."""

    symbol: str
    demangled: str
    problem: str  # ABI_MISMATCH when `twin` (the same entity under the other ABI) is exported, else VERSION_MISMATCH
    twin: str | None = None
    twin_demangled: str | None = None

    def to_json(self) -> dict:
        return {"symbol": self.symbol, "demangled": self.demangled, "problem": self.problem, "twin": self.twin,
                "twin_demangled": self.twin_demangled}


@dataclass(frozen=True)
class ExtensionCheck:
    """One extension module (or plugin) linking torch, and what it would fail to resolve."""

    path: str
    abi: str
    verdict: str
    torch_symbols: int  # undefined C++ symbols looked up in torch (found or not)
    missing: tuple[MissingSymbol, ...] = ()
    from_cuda_stub: tuple[MissingSymbol, ...] = ()  # not in torch, bound to torch_xla's CUDA stub instead
    distribution: str | None = None  # "torchvision 0.23.0": the installed distribution whose RECORD lists it
    requires_torch: str | None = None  # the exact torch its metadata pins (Requires-Dist: torch==X), if any
    registers_operators: bool = False  # calls torch::Library / c10::RegisterOperators (TORCH_LIBRARY...)

    @property
    def pinned_elsewhere(self) -> bool:
        """Its distribution pins another torch than the one here (see _check_extension)."""
        return self.verdict == VERSION_MISMATCH and not self.missing and self.requires_torch is not None

    def to_json(self) -> dict:
        return {"path": self.path, "abi": self.abi, "verdict": self.verdict, "torch_symbols": self.torch_symbols,
                "missing": [symbol.to_json() for symbol in self.missing],
                "from_cuda_stub": [symbol.to_json() for symbol in self.from_cuda_stub],
                "distribution": self.distribution, "requires_torch": self.requires_torch,
                "registers_operators": self.registers_operators}


@dataclass(frozen=True)
class CheckReport:
    """Would `import torch_xla` (and every other torch extension here) load beside this torch?"""

    path: str
    verdict: str  # COMPATIBLE | ABI_MISMATCH | VERSION_MISMATCH
    summary: str
    torch_abi: str
    torch_libraries: tuple[str, ...]
    extensions: tuple[ExtensionCheck, ...]
    torch_version: str | None = None  # from torch-X.dist-info, when there is one

    @property
    def compatible(self) -> bool:
        return self.verdict == COMPATIBLE

    @property
    def needs_cuda_unavailable(self) -> bool:
        """Loads only where torch sees no GPU (some symbol comes from torch_xla's CUDA stub)."""
        return any(extension.from_cuda_stub for extension in self.extensions)

    def to_json(self) -> dict:
        return {"path": self.path, "verdict": self.verdict, "summary": self.summary, "torch_abi": self.torch_abi,
                "torch_version": self.torch_version, "needs_cuda_unavailable": self.needs_cuda_unavailable,
                "torch_libraries": list(self.torch_libraries),
                "extensions": [extension.to_json() for extension in self.extensions]}


@dataclass
class _Loaded:
    """A shared object read once for both questions."""

    relative: str
    path: Path
    dynamic: ElfDynamic
    mentions_torch: bool = True
    report: SharedObjectReport | None = None  # None until the symbol table is read


def check_site_packages(path: Path) -> CheckReport:
    """Resolve the torch symbols of every extension under a site-packages (or a venv root holding one)."""
    site = find_torch_site(Path(path))
    return _check_site(site, display=str(path))


def check_image(image: str) -> list[CheckReport]:
    """check_site_packages for each site-packages of an image that holds torch, without running the image."""
    with tempfile.TemporaryDirectory(prefix="xla-images-abi-") as scratch:
        reports = [
            _check_site(local, display=f"{image}:{inside}")
            for inside, local in _extract_site_packages(image, Path(scratch))
            if _has_torch_libraries(local)
        ]
    if not reports:
        raise _usage_error(f"no torch found in {image}",
                           hint=f"looked for torch/lib/libtorch*.so under {', '.join(SITE_PACKAGES_GLOBS)}")
    return reports


def check_target(target: str) -> list[CheckReport]:
    """The CLI's argument: an existing path, else an image reference."""
    if is_path_target(target):
        path = Path(target).expanduser()
        if not path.exists():
            raise missing_path_error(path, "pass a site-packages directory or an image reference")
        if not path.is_dir():
            raise _usage_error(f"{path} is not a directory",
                               hint="check needs torch and the extensions side by side: pass a site-packages "
                                    "(e.g. `pip install --target DIR torch torch_xla` then DIR) or an image")
        return [check_site_packages(path)]
    return check_image(target)


def find_torch_site(path: Path) -> Path:
    """path itself when it holds torch/lib, else the one lib/python3.*/site-packages under it (a venv root)."""
    if not path.is_dir():
        raise _usage_error(f"{path} is not a directory", hint="pass a site-packages directory or a venv")
    if _has_torch_libraries(path):
        return path
    candidates = [site for site in sorted(path.glob("lib/python3.*/site-packages")) if _has_torch_libraries(site)]
    if len(candidates) == 1:
        return candidates[0]
    raise _usage_error(f"no torch found in {path}",
                       hint="pass the site-packages directory that holds torch/lib/libtorch*.so "
                            "(e.g. VENV/lib/python3.11/site-packages)")


def _has_torch_libraries(site: Path) -> bool:
    library = site / "torch" / "lib"
    return library.is_dir() and (any(library.glob("libtorch*.so*")) or any(library.glob("libc10*.so*")))


def _check_site(site: Path, *, display: str) -> CheckReport:
    torch, others = _load_site(site)
    exported: set[str] = set()
    for library in torch:
        exported |= library.dynamic.defined
    torch_names = {name for library in torch for name in (library.path.name, library.dynamic.soname) if name}
    twins = _TwinIndex(exported)
    cuda_stub = _cuda_stub_definitions(others)
    linking = [candidate for candidate in others if _links_torch(candidate, torch_names, candidate.mentions_torch)]
    torch_version = installed_torch_version(site)
    owners = distributions_of(site, {candidate.relative for candidate in linking})
    extensions = []
    for candidate in linking:
        own = _defined_by_own_dependencies(candidate, torch_names)
        stub = cuda_stub if _loads_after_cuda_stub(candidate) else set()
        checked = _check_extension(candidate, exported, own, twins, stub)
        extensions.append(_with_distribution(checked, owners.get(candidate.relative), torch_version))
    torch_abi = package_abi(library.report for library in torch)
    extensions = _demangle_missing(extensions)
    verdict, summary = _site_verdict(extensions, torch_abi, torch_version)
    return CheckReport(display, verdict, summary, torch_abi, tuple(library.relative for library in torch),
                       tuple(extensions), torch_version)


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
    """relative path -> the distribution whose RECORD lists it, for the given files under site.

    Metadata is advisory here: an unreadable, oversized or garbled RECORD/METADATA only means no distribution is
    named for those files (the symbol check does not depend on it)."""
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


def _with_distribution(extension: ExtensionCheck, owner: Distribution | None,
                       torch_version: str | None) -> ExtensionCheck:
    """Attach the owning distribution; one pinned to another torch release is a version mismatch even when
    every symbol resolves: it was compiled against that torch's headers (struct layouts, inline code, operator
    schemas), which symbol tables cannot show. torchvision 0.23.0 (torch==2.8.0) resolves every symbol of torch
    2.9.0 and crashes (SIGSEGV) while registering its operators at import."""
    if owner is None:
        return extension
    verdict = extension.verdict
    if (verdict == COMPATIBLE and owner.requires_torch and torch_version
            and not same_release(owner.requires_torch, torch_version)):
        verdict = VERSION_MISMATCH
    return ExtensionCheck(extension.path, extension.abi, verdict, extension.torch_symbols, extension.missing,
                          extension.from_cuda_stub, str(owner), owner.requires_torch, extension.registers_operators)


def _load_site(site: Path) -> tuple[list[_Loaded], list[_Loaded]]:
    """(torch's own shared objects, every other shared object) under site; the others' symbols are read lazily."""
    torch: list[_Loaded] = []
    others: list[_Loaded] = []
    for relative, full in walk_shared_objects(site):
        parts = Path(relative).parts
        if parts[0] == "torch" and (len(parts) == 2 or parts[1] == "lib"):
            torch.append(_load(relative, full))
        elif parts[0] != "torch":
            others.append(_Loaded(relative, full, *_read_link_summary(full)))
    return torch, others


def _load(relative: str, full: Path) -> _Loaded:
    dynamic = read_elf_file(full, relative)
    return _Loaded(relative, full, dynamic, report=classify_dynamic(dynamic, relative))


_TORCH_NAMESPACE_BYTES = re.compile(_TORCH_NAMESPACE.pattern.encode())


def _read_link_summary(full: Path) -> tuple[ElfDynamic, bool]:
    """DT_NEEDED, the search path, and whether any dynamic symbol names a torch namespace, without decoding
    the symbol table: most shared objects in a site-packages (CUDA libraries, numpy) have nothing to do with
    torch and are never read further."""
    info = ElfDynamic()
    try:
        with open(full, "rb") as handle, _corrupt_elf_errors():
            elf = _open_elf(handle)
            sections = _sections_by_type(elf, ("SHT_DYNAMIC", "SHT_DYNSYM"))
            if "SHT_DYNAMIC" in sections:
                _read_dynamic_tags(sections["SHT_DYNAMIC"], info)
            dynsym = sections.get("SHT_DYNSYM")
            names = _section_data(elf.get_section(dynsym["sh_link"])) if dynsym is not None else b""
    except CorruptElf as error:
        raise _unreadable_elf(str(full), error) from None
    except OSError as error:
        raise _unreadable_path(str(full), error) from None
    return info, _TORCH_NAMESPACE_BYTES.search(names) is not None


def _links_torch(candidate: _Loaded, torch_names: set[str], mentions_torch: bool) -> bool:
    """Is this an extension of torch? _XLAC always is; others DT_NEED a torch library or name torch symbols.

    DT_NEEDED alone is not enough: linked with --as-needed (Debian's default), an extension built with the
    other ABI than torch satisfies none of its symbols from libc10/libtorch, so the linker drops them.
    """
    name = os.path.basename(candidate.relative)
    if not (name.startswith("_XLAC") or torch_names.intersection(candidate.dynamic.needed) or mentions_torch):
        return False
    _read_symbols_of(candidate)
    return True


def _read_symbols_of(candidate: _Loaded) -> None:
    """Replace the link summary with the full symbol table, once."""
    if candidate.report is None:
        loaded = _load(candidate.relative, candidate.path)
        candidate.dynamic, candidate.report = loaded.dynamic, loaded.report


def _defined_by_own_dependencies(candidate: _Loaded, torch_names: set[str]) -> set[str]:
    """Symbols from the extension's other DT_NEEDED libraries found through its $ORIGIN-relative search path
    (e.g. torch_xla/lib/*.so). System libraries are reached through versioned references, which are skipped."""
    origin = str(candidate.path.parent)
    # Last, the extension's own directory: packages preload such siblings by path (torchaudio loads
    # libtorchaudio_sox.so with ctypes before _torchaudio_sox.so, which has no RUNPATH), and a library already
    # loaded satisfies DT_NEEDED by its name.
    directories = [entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                   for entry in candidate.dynamic.search_path if "$ORIGIN" in entry or "${ORIGIN}" in entry]
    directories.append(origin)
    defined: set[str] = set()
    for needed in candidate.dynamic.needed:
        if needed in torch_names or "/" in needed:
            continue
        for directory in directories:
            library = Path(directory, needed)
            if library.is_file() and is_elf(library):
                defined |= read_elf_file(library).defined
                break
    return defined


def _cuda_stub_definitions(others: Sequence[_Loaded]) -> set[str]:
    """What torch_xla's CUDA stub extension (top level of the site-packages) defines, if it is there."""
    defined: set[str] = set()
    for candidate in others:
        if _is_cuda_stub(candidate.relative):
            _read_symbols_of(candidate)
            defined |= candidate.dynamic.defined
    return defined


def _is_cuda_stub(relative: str) -> bool:
    return "/" not in relative and relative.startswith(CUDA_STUB_PREFIX)


def _loads_after_cuda_stub(candidate: _Loaded) -> bool:
    name = candidate.relative
    return "/" not in name and name.startswith("_XLAC") and not _is_cuda_stub(name)


class _TwinIndex:
    """abi_neutral_key -> exported names, built only when some symbol is missing (usually never)."""

    def __init__(self, exported: set[str]) -> None:
        self._exported = exported
        self._index: dict[str, list[str]] | None = None

    def find(self, name: str) -> str | None:
        if self._index is None:
            self._index = {}
            for exported in self._exported:
                if exported.startswith("_Z"):
                    self._index.setdefault(abi_neutral_key(exported), []).append(exported)
        markers = symbol_abi(name)
        for candidate in self._index.get(abi_neutral_key(name), ()):
            if candidate != name and symbol_abi(candidate) != markers:
                return candidate
        return None


def _check_extension(extension: _Loaded, exported: set[str], own: set[str], twins: _TwinIndex,
                     cuda_stub: set[str]) -> ExtensionCheck:
    """Look up the extension's undefined C++ symbols in what torch exports (exported), in what its own
    bundled libraries define (own) and, for _XLAC, in torch_xla's CUDA stub (cuda_stub)."""
    looked_up = 0
    missing: list[MissingSymbol] = []
    from_stub: list[MissingSymbol] = []
    for symbol in extension.dynamic.undefined:
        # Weak references never fail a load; versioned ones are bound to libstdc++/libc/libm ..., never to torch
        # (torch libraries define no symbol versions); C symbols (PyObject_*, cuda*) are not ours to judge.
        if symbol.weak or symbol.version_file or not symbol.name.startswith("_Z"):
            continue
        if symbol.name in exported:
            looked_up += 1
            continue
        if symbol.name in own:
            continue
        if symbol.name in cuda_stub:
            from_stub.append(MissingSymbol(symbol.name, symbol.name, FROM_CUDA_STUB))
            looked_up += 1
            continue
        twin = twins.find(symbol.name)
        if twin is not None:
            missing.append(MissingSymbol(symbol.name, symbol.name, ABI_MISMATCH, twin, twin))
        elif is_torch_entity(symbol.name):
            missing.append(MissingSymbol(symbol.name, symbol.name, VERSION_MISMATCH))
        else:
            continue  # some other library's C++ symbol: the check cannot tell and does not guess
        looked_up += 1
    if any(item.problem == ABI_MISMATCH for item in missing):
        verdict = ABI_MISMATCH
    else:
        verdict = VERSION_MISMATCH if missing else COMPATIBLE
    registers = any(_REGISTERS_OPERATORS.match(symbol.name) for symbol in extension.dynamic.undefined)
    return ExtensionCheck(extension.relative, extension.report.abi, verdict, looked_up,
                          tuple(sorted(missing, key=lambda item: (item.problem, item.symbol))),
                          tuple(sorted(from_stub, key=lambda item: item.symbol)), registers_operators=registers)


def _demangle_missing(extensions: list[ExtensionCheck]) -> list[ExtensionCheck]:
    names = {name for extension in extensions for item in (*extension.missing, *extension.from_cuda_stub)
             for name in (item.symbol, item.twin) if name}
    readable = demangle(sorted(names))

    def readable_items(items: Sequence[MissingSymbol]) -> tuple[MissingSymbol, ...]:
        return tuple(MissingSymbol(item.symbol, readable.get(item.symbol, item.symbol), item.problem, item.twin,
                                   readable.get(item.twin, item.twin) if item.twin else None) for item in items)

    return [replace(extension, missing=readable_items(extension.missing),
                    from_cuda_stub=readable_items(extension.from_cuda_stub)) for extension in extensions]


DEMANGLE_TIMEOUT = 20.0
DEMANGLE_MAX_CHARS = 16384


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> readable with c++filt when installed; otherwise names stay mangled."""
    tool = shutil.which("c++filt")
    if not names or tool is None or any(len(name) > DEMANGLE_MAX_CHARS or "\n" in name for name in names):
        return {name: name for name in names}
    # c++filt has had crashes and exponential blow-ups on crafted names: bounded, and then names stay mangled.
    try:
        completed = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                                   check=False, timeout=DEMANGLE_TIMEOUT)
    except (subprocess.TimeoutExpired, OSError):
        return {name: name for name in names}
    lines = completed.stdout.splitlines()
    if completed.returncode != 0 or len(lines) != len(names):
        return {name: name for name in names}
    return dict(zip(names, lines))


def _site_verdict(extensions: Sequence[ExtensionCheck], torch_abi: str,
                  torch_version: str | None = None) -> tuple[str, str]:
    if not extensions:
        return COMPATIBLE, "compatible: no extension module here links torch"
    broken = [extension for extension in extensions if extension.verdict != COMPATIBLE]
    if not broken:
        total = sum(extension.torch_symbols for extension in extensions)
        return COMPATIBLE, (f"compatible: {len(extensions)} extension(s) resolve all {total} torch symbols "
                            f"(torch uses the {torch_abi} ABI)" + _cuda_stub_remark(extensions)
                            + _operators_remark(extensions, torch_version))
    abi_broken = [extension for extension in broken if extension.verdict == ABI_MISMATCH]
    if abi_broken:
        lines = []
        for extension in abi_broken:
            twins = sum(item.problem == ABI_MISMATCH for item in extension.missing)
            lines.append(f"{extension.path} ({extension.abi} ABI) needs {twins} symbol(s) that torch "
                         f"({torch_abi} ABI) exports only with the other ABI's mangling")
        return ABI_MISMATCH, "abi mismatch: " + "; ".join(lines)
    this = f"torch {torch_version}" if torch_version else "this torch"
    lines = [_version_line(extension, this) for extension in broken if not extension.pinned_elsewhere]
    pinned: dict[tuple[str, str], list[str]] = {}
    for extension in broken:
        if extension.pinned_elsewhere:
            pinned.setdefault((extension.distribution, extension.requires_torch), []).append(extension.path)
    lines.extend(f"{distribution} ({_some(paths)}) requires torch=={requires}, this is {this}: its symbols resolve, "
                 f"but it was compiled against another torch release's headers (layouts, inline code, operator "
                 f"schemas), which symbols cannot check" for (distribution, requires), paths in pinned.items())
    return VERSION_MISMATCH, "version mismatch: " + "; ".join(lines)


def _version_line(extension: ExtensionCheck, this: str) -> str:
    pinned = f" ({extension.distribution} requires torch=={extension.requires_torch})" \
        if extension.requires_torch else ""
    return (f"{extension.path}{pinned} needs {len(extension.missing)} torch symbol(s) {this} does not export under "
            f"either ABI - it was built against another torch version")


def _built_with(extension: ExtensionCheck, torch_version: str | None) -> bool:
    """Built together with this torch release: pinned to it, or torch_xla X.Y beside torch X.Y (torch_xla pins no
    torch in its metadata; upstream builds each torch_xla release against the torch release of the same number)."""
    if not torch_version or not extension.distribution:
        return False
    if extension.requires_torch:
        return same_release(extension.requires_torch, torch_version)
    name, _, version = extension.distribution.partition(" ")
    return name.lower().replace("-", "_") == "torch_xla" and version.split(".")[:2] == torch_version.split(".")[:2]


def _operators_remark(extensions: Sequence[ExtensionCheck], torch_version: str | None) -> str:
    """Symbols resolving does not prove operator registration works: say so for extensions not pinned to this
    very torch release by their metadata."""
    unchecked = [extension.path for extension in extensions
                 if extension.registers_operators and not _built_with(extension, torch_version)]
    if not unchecked:
        return ""
    return (f"; symbols resolve, runtime operator compatibility not checkable: {_some(unchecked)} register torch "
            f"operators and pin no torch release in their metadata")


def _cuda_stub_remark(extensions: Sequence[ExtensionCheck]) -> str:
    stubbed = [item.demangled for extension in extensions for item in extension.from_cuda_stub]
    if not stubbed:
        return ""
    verb = "is" if len(stubbed) == 1 else "are"
    return (f"; only while CUDA is unavailable: {len(stubbed)} of them ({_some(stubbed)}) {verb} not in this torch "
            f"and bind to torch_xla's {CUDA_STUB_PREFIX}, which torch_xla loads only when torch.cuda.is_available() is "
            f"False - where torch sees a GPU, `import torch_xla` fails (pytorch/xla#9656)")


# --------------------------------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------------------------------


# The image reference grammar of the distribution project (reference.go), without IPv6 hosts: a reference the
# engine would refuse as "invalid reference format" is the user's typo, reported before asking the engine.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
RULE_IMAGE = "abi-image-reference"


def check_image_reference(image: str) -> None:
    if len(image) > 512 or _IMAGE_REFERENCE.fullmatch(image) is None:
        shown = image if len(image) <= 80 else image[:80] + "..."
        raise _usage_error(f"{shown!r} is neither an existing path nor a valid image reference", rule=RULE_IMAGE,
                           hint="pass a wheel, a directory, a .so file or an image such as "
                                "xla-images:r2.9.0_3.11_cpu (lowercase repository, optional :tag or @sha256:...)")


def _extract_site_packages(image: str, scratch: Path) -> list[tuple[str, Path]]:
    """(path in the image, local copy) of each site-packages matching SITE_PACKAGES_GLOBS.

    Nothing runs in the image: for each glob the engine copies its fixed leading directory out of a created,
    never started container, and the wildcard is matched locally.
    """
    check_image_reference(image)
    try:
        from xla_images.run import engine
    except ImportError as error:
        raise _usage_error(f"{image!r} is not an existing path, and images can only be read with xla_images "
                           f"installed ({error})", hint="pass a wheel or a directory") from None
    found: list[tuple[str, Path]] = []
    for number, pattern in enumerate(SITE_PACKAGES_GLOBS):
        fixed, wildcard = _split_glob(pattern)
        try:
            local = engine.containers.extract_from_image(image, fixed, scratch / str(number))
        except Exception as error:  # noqa: BLE001 - sorted by the engine's rule, anything else propagates
            rule = getattr(error, "rule", None)
            if rule == "image-path-exists":
                continue
            if rule == "image-exists":
                raise _usage_error(f"{image} is neither an existing path nor an image on this engine",
                                   hint="check the path, or build/pull the image first") from None
            raise
        matches = sorted(local.glob(wildcard)) if wildcard else [local]
        found.extend((str(Path(fixed, match.relative_to(local))), match) for match in matches if match.is_dir())
    if not found:
        raise _usage_error(f"no python site-packages found in image {image}",
                           hint=f"looked in {', '.join(SITE_PACKAGES_GLOBS)}")
    return found


def _split_glob(pattern: str) -> tuple[str, str]:
    """'/opt/venv/lib/python3.*/site-packages' -> ('/opt/venv/lib', 'python3.*/site-packages')."""
    parts = Path(pattern).parts
    for index, part in enumerate(parts):
        if any(char in part for char in "*?["):
            return str(Path(*parts[:index])), str(Path(*parts[index:]))
    return pattern, ""


# --------------------------------------------------------------------------------------------------------------
# plain-text output and the standalone command line
# --------------------------------------------------------------------------------------------------------------


def format_package(report: PackageReport) -> str:
    lines = [f"{report.path} [{report.kind}] abi={report.abi} platform={report.platform_tag or '-'}",
             f"  verdict: {report.verdict}"]
    for item in report.shared_objects:
        notes = ["bundled toolchain runtime"] if item.bundled_runtime else []
        if item.abi_basis != INTERFACE_BASIS:
            notes.append(f"from {item.abi_basis}")
        bundled = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {item.abi:<9} glibc={item.glibc or '-':<5} glibcxx={item.glibcxx or '-':<7} "
                     f"cxx11={item.cxx11_symbols:<6} pre={item.pre_cxx11_symbols:<6} {item.path}{bundled}")
    return "\n".join(lines)


def format_check(report: CheckReport, limit: int = 20) -> str:
    version = f" (torch {report.torch_version})" if report.torch_version else ""
    lines = [f"{report.path}: torch libraries{version} use the {report.torch_abi} ABI"]
    for extension in report.extensions:
        owner = f", {extension.distribution}" if extension.distribution else ""
        owner += f" requires torch=={extension.requires_torch}" if extension.requires_torch else ""
        lines.append(f"  {extension.verdict:<16} {extension.path} (abi {extension.abi}, "
                     f"{extension.torch_symbols} torch symbols{owner})")
        for item in extension.missing[:limit]:
            lines.append(f"    missing [{item.problem}] {item.demangled}")
            if item.twin_demangled:
                lines.append(f"      torch exports instead: {item.twin_demangled}")
        if len(extension.missing) > limit:
            lines.append(f"    ... and {len(extension.missing) - limit} more (--json lists all)")
        for item in extension.from_cuda_stub[:limit]:
            lines.append(f"    from {CUDA_STUB_PREFIX} (no GPU only) {item.demangled}")
    lines.append(report.summary)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python abi.py inspect|check TARGET [--json]`: exit 0 fine, 1 mismatch, 2 usage error."""
    parser = argparse.ArgumentParser(prog="abi", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("inspect", "ABI of each shared object of a wheel, directory or image"),
                       ("check", "would the extensions here load beside this torch?")):
        command = commands.add_parser(name, help=text)
        command.add_argument("target", help="wheel, directory (site-packages) or image reference")
        command.add_argument("--json", action="store_true", help="machine-readable output")
    arguments = parser.parse_args(argv)
    try:
        one = is_path_target(arguments.target)
        if arguments.command == "inspect":
            packages = inspect_target(arguments.target)
            _emit(packages, arguments.json, format_package, one)
            return 0
        checks = check_target(arguments.target)
        _emit(checks, arguments.json, format_check, one)
        return 0 if all(report.compatible for report in checks) else 1
    except Exception as error:  # noqa: BLE001 - only usage errors are turned into exit code 2
        if getattr(error, "exit_code", None) == 2:
            print(str(error), file=sys.stderr)
            return 2
        raise


def _emit(reports: Sequence, as_json: bool, formatter, one: bool) -> None:
    if as_json:
        document = reports[0].to_json() if one else [report.to_json() for report in reports]
        print(json.dumps(document, indent=2))
    else:
        print("\n\n".join(formatter(report) for report in reports))


if __name__ == "__main__":
    sys.exit(main())
