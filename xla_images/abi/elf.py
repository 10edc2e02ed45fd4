"""Read what the dynamic linker sees of an ELF shared object: its dynamic symbols, DT_NEEDED, search path, soname
and symbol versions (needed and defined).

Only the standard library: the ELF and section headers and the dynamic tables are unpacked with `struct`. Input is
hostile by assumption (issue 19): every table is checked to lie inside the file before it is read, and every walk
over a table is bounded by the table's real bytes and by its entry count, whatever the headers claim. A version-
need chain whose `vn_next` is 0 ends there, as in glibc's loader, instead of revisiting one entry forever (a fuzzed
library with that shape once made the reader loop for 20 minutes and grow to 9 GB).
"""
from __future__ import annotations

import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, NamedTuple, Sequence

from ..errors import ConfigError
from .words import RULE_ELF, RULE_PATH, usage_error

ELF_MAGIC = b"\x7fELF"

_SHT_DYNAMIC, _SHT_DYNSYM = 6, 11
_SHT_NOBITS = 8
_SHT_GNU_VERDEF, _SHT_GNU_VERNEED, _SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_DT_NULL, _DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 14, 15, 29

_SHN_UNDEF, _SHN_XINDEX = 0, 0xFFFF
_STB_LOCAL, _STB_WEAK = 0, 2
_STV_DEFAULT, _STV_PROTECTED = 0, 3
_VERSYM_HIDDEN = 0x8000

# The biggest dynamic tables of real libraries are tens of MB (torch_xla 2.8.1's _XLAC: one of 69.6 MB; torch 2.9's
# CUDA site: 2.2 MB at most, measured 2026-12); a sparse file or a lying sh_size must not make one read allocate
# gigabytes, nor a verdict depend on the RAM at hand (tables of hundreds of MB once took 2.6-4.3 GB, issue 35).
# One table beyond MAX_TABLE_BYTES, or the tables of one object beyond MAX_TABLES_BYTES together, is refused with a
# clear error: 3.7x and 5.5x the largest real one.
MAX_TABLE_BYTES = 256 << 20
MAX_TABLES_BYTES = 384 << 20
_MAX_SECTIONS = 1 << 18
# Real dynamic symbol names are at most a few KiB, even for deeply templated C++. A name is looked for only this far from its offset: a string table without a NUL made every
# name run to the table's end, one copy of up to 64 MB per symbol (more than 2 GB for one library, issue 41).
MAX_NAME_BYTES = 64 << 10


class CorruptElf(ValueError):
    """ELF bytes whose headers or dynamic tables do not hold together (the dynamic linker would refuse them too).

    Internal to the package: callers that know the file's name turn it into the project's ConfigError
    (`unreadable_elf`), so users only ever see one error type."""


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
    runpath: tuple[str, ...] = ()  # DT_RUNPATH split on ':': searched for this object's own DT_NEEDED only
    rpath: tuple[str, ...] = ()  # DT_RPATH: ignored when DT_RUNPATH is present, else inherited by what it loads
    soname: str | None = None
    version_needs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # library file -> versions it must offer
    version_defs: tuple[str, ...] = ()  # versions this object defines (GLIBCXX_3.4.30 ...)
    mentions: bytes = b""  # the dynamic string table, kept only by `read_link_summary`


@dataclass(frozen=True)
class _Layout:
    little: bool
    wide: bool  # ELFCLASS64

    @property
    def endian(self) -> str:
        return "<" if self.little else ">"


class _Section(NamedTuple):  # built for every section of every library: a tuple is cheaper than a dataclass
    type: int
    offset: int
    size: int
    link: int
    info: int


class _Image:
    """An ELF stream with its section headers, every one checked against the stream's real size."""

    def __init__(self, stream: IO[bytes]) -> None:
        if stream.read(4) != ELF_MAGIC:
            raise CorruptElf("no ELF magic")
        stream.seek(0, os.SEEK_END)
        self.size = stream.tell()
        self.stream = stream
        stream.seek(0)
        ident = stream.read(16)
        if len(ident) < 16 or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise CorruptElf("unknown ELF class or byte order")
        self.layout = _Layout(little=ident[5] == 1, wide=ident[4] == 2)
        self.sections = self._section_headers()
        self.read_bytes = 0  # bytes of tables read so far, bounded by MAX_TABLES_BYTES
        self._read: dict[tuple[int, int], bytes] = {}  # .dynstr serves four tables: read once

    def _unpack(self, layout: str, offset: int) -> tuple:
        fmt = self.layout.endian + layout
        data = self._bytes(offset, struct.calcsize(fmt))
        return struct.unpack(fmt, data)

    def _bytes(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptElf(f"{length} bytes at offset {offset} run past the end of the file ({self.size} bytes): "
                             f"truncated?")
        self.stream.seek(offset)
        data = self.stream.read(length)
        if len(data) != length:
            raise CorruptElf(f"short read at offset {offset}")
        return data

    def _section_headers(self) -> list[_Section]:
        header = "HHIQQQIHHHHHH" if self.layout.wide else "HHIIIIIHHHHHH"
        fields = self._unpack(header, 16)
        shoff, shentsize, shnum, shstrndx = fields[5], fields[10], fields[11], fields[12]
        if shoff == 0:
            return []
        entry = "IIQQQQIIQQ" if self.layout.wide else "IIIIIIIIII"
        expected = struct.calcsize("<" + entry)
        if shentsize != expected:
            raise CorruptElf(f"section header size {shentsize}, expected {expected}")
        if shnum == 0:  # more than 0xff00 sections: the count is section 0's sh_size
            shnum = self._header(entry, shoff).size
        if shnum > _MAX_SECTIONS:
            raise CorruptElf(f"{shnum} section headers (more than {_MAX_SECTIONS}; shared objects have a few dozen)")
        if shoff + shnum * expected > self.size:
            raise CorruptElf(f"{shnum} section headers at offset {shoff} run past the end of the file "
                             f"({self.size} bytes): truncated?")
        if shstrndx != _SHN_XINDEX and shstrndx >= shnum:
            raise CorruptElf(f"section name table index {shstrndx} out of range ({shnum} sections)")
        # One read for all the headers: per-header seeks and reads were most of the cost of a tiny library.
        table = self._bytes(shoff, shnum * expected)
        return [_Section(kind, offset, size, link, info) for _, kind, _, _, offset, size, link, info, _, _
                in struct.iter_unpack(self.layout.endian + entry, table)]  # NamedTuple: cheap to build

    def _header(self, entry: str, offset: int) -> _Section:
        _, kind, _, _, sh_offset, sh_size, link, info, _, _ = self._unpack(entry, offset)
        return _Section(kind, sh_offset, sh_size, link, info)

    def first(self, kind: int) -> _Section | None:
        return next((section for section in self.sections if section.type == kind), None)

    def data(self, section: _Section) -> bytes:
        """A section's bytes: inside the file, and not absurdly large."""
        if section.type == _SHT_NOBITS:
            return b""
        if section.size > MAX_TABLE_BYTES:
            raise CorruptElf(f"a section claims {section.size} bytes (more than {MAX_TABLE_BYTES}, the limit of one "
                             f"dynamic table; the largest real ones are tens of MB)")
        key = (section.offset, section.size)
        if key in self._read:
            return self._read[key]
        self.read_bytes += section.size
        if self.read_bytes > MAX_TABLES_BYTES:
            raise CorruptElf(f"its dynamic tables claim more than {MAX_TABLES_BYTES} bytes together (the limit; the "
                             f"largest real ones are tens of MB)")
        self._read[key] = self._bytes(section.offset, section.size)
        return self._read[key]

    def linked(self, section: _Section) -> bytes:
        """The bytes of the string table a section's sh_link names."""
        if not 0 < section.link < len(self.sections):
            raise CorruptElf(f"sh_link {section.link} names no section")
        return self.data(self.sections[section.link])


@contextmanager
def corrupt_elf_errors() -> Iterator[None]:
    """Any exception while decoding ELF bytes means the bytes are bad (struct.error, IndexError, ValueError,
    UnicodeDecodeError... depending on which field is broken)."""
    try:
        yield
    except CorruptElf:
        raise
    except MemoryError:
        raise CorruptElf("a table is too large to read") from None
    except (struct.error, IndexError, KeyError, ValueError, OverflowError, UnicodeError) as error:
        reason = f"{type(error).__name__}: {error}".strip().rstrip(":")
        raise CorruptElf(reason if len(reason) <= 200 else reason[:200] + "...") from None


def read_elf_dynamic(stream: IO[bytes]) -> ElfDynamic:
    """Parse dynsym, versions and the dynamic section of an ELF stream; CorruptElf when the bytes do not hold
    together. Symbol entries are unpacked with struct.iter_unpack: torch libraries export hundreds of thousands."""
    with corrupt_elf_errors():
        image = _Image(stream)
        info = ElfDynamic()
        _read_dynamic_section(image, info)
        version_index = _read_version_needs(image, info)
        info.version_defs = _read_version_defs(image)
        dynsym = image.first(_SHT_DYNSYM)
        if dynsym is None:
            return info  # a static or sstripped object: nothing the dynamic linker would resolve by name
        strings = image.linked(dynsym)
        versym = _read_versym(image)
        _read_symbols(image.data(dynsym), strings, versym, version_index, image.layout, info)
        return info


def read_link_summary(stream: IO[bytes]) -> ElfDynamic:
    """The dynamic section and the raw dynamic string table (`mentions`), without decoding the symbol table:
    most shared objects of a site-packages (CUDA libraries, numpy) never need more."""
    with corrupt_elf_errors():
        image = _Image(stream)
        info = ElfDynamic()
        _read_dynamic_section(image, info)
        dynsym = image.first(_SHT_DYNSYM)
        info.mentions = image.linked(dynsym) if dynsym is not None else b""
        return info


def _name_end(table: bytes | str, offset: int) -> int:
    """Where the name at offset ends: its NUL, or the table's end when that is near; searched at most
    MAX_NAME_BYTES from offset, so a table without NULs costs one bounded scan per name, not a copy to its end."""
    limit = offset + MAX_NAME_BYTES
    end = table.find(b"\0" if isinstance(table, bytes) else "\0", offset, limit + 1)
    if end >= 0:
        return end
    if len(table) <= limit:
        return len(table)
    raise CorruptElf(f"the name at offset {offset} of its string table has no NUL within {MAX_NAME_BYTES} bytes "
                     f"(the limit of one symbol name; real ones are a few KiB)")


def _string(table: bytes, offset: int) -> str:
    if not 0 <= offset < len(table):
        raise CorruptElf(f"string offset {offset} outside its table ({len(table)} bytes)")
    return table[offset:_name_end(table, offset)].decode("latin-1")


def _read_dynamic_section(image: _Image, info: ElfDynamic) -> None:
    dynamic = image.first(_SHT_DYNAMIC)
    if dynamic is None:
        return
    data, strings = image.data(dynamic), image.linked(dynamic)
    layout = image.layout.endian + ("qQ" if image.layout.wide else "iI")
    entry = struct.calcsize(layout)
    needed: list[str] = []
    runpath: list[str] = []
    rpath: list[str] = []
    for tag, value in struct.iter_unpack(layout, data[:len(data) - len(data) % entry]):  # bounded by the bytes
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(_string(strings, value))
        elif tag == _DT_RUNPATH:
            runpath.extend(_string(strings, value).split(":"))
        elif tag == _DT_RPATH:
            rpath.extend(_string(strings, value).split(":"))
        elif tag == _DT_SONAME:
            info.soname = _string(strings, value)
    info.needed = tuple(needed)
    info.runpath = tuple(part for part in runpath if part)
    info.rpath = tuple(part for part in rpath if part)


def _chain(data: bytes, count: int, head: str, link_field: int, start: int = 0) -> Iterator[tuple[int, tuple]]:
    """(offset, fields) of the `count` records chained by a relative `next` field inside data, from `start`.

    At most (len(data) - start) / record size records, each read once and in place (never a slice of the rest of the
    table per record: 2**20 version needs made that quadratic, issue 35): `next` is unsigned, so the walk only moves
    forward, and a count the table cannot hold, a record past the table or a chain that ends (`next` 0) before
    `count` records are corrupt."""
    offset, size = start, struct.calcsize(head)
    if start < 0 or count > (len(data) - start) // size:
        raise CorruptElf(f"version records claim {count} entries in {max(len(data) - start, 0)} bytes")
    for number in range(count):
        if offset + size > len(data):
            raise CorruptElf(f"a version record at offset {offset} runs past its table ({len(data)} bytes)")
        fields = struct.unpack_from(head, data, offset)
        yield offset, fields
        step = fields[link_field]
        if step == 0 and number + 1 < count:
            raise CorruptElf(f"the version chain ends after {number + 1} of {count} records (a next of 0)")
        offset += step


def _read_version_needs(image: _Image, info: ElfDynamic) -> dict[int, tuple[str, str]]:
    """Map version index -> (library file, version name), and record every version each library must offer."""
    index: dict[int, tuple[str, str]] = {}
    verneed = image.first(_SHT_GNU_VERNEED)
    if verneed is None:
        return index
    data, strings, endian = image.data(verneed), image.linked(verneed), image.layout.endian
    needs: dict[str, list[str]] = {}
    # Elf_Verneed: vn_version, vn_cnt, vn_file, vn_aux, vn_next; Elf_Vernaux: vna_hash, vna_flags, vna_other,
    # vna_name, vna_next (the same layout in both classes).
    for offset, (_, count, file_offset, aux, _) in _chain(data, verneed.info, endian + "HHIII", 4):
        library = _string(strings, file_offset)
        versions = needs.setdefault(library, [])
        for _, (_, _, other, name, _) in _chain(data, count, endian + "IHHII", 4, offset + aux):
            index[other & ~_VERSYM_HIDDEN] = (library, _string(strings, name))
            versions.append(_string(strings, name))
    info.version_needs = {name: tuple(versions) for name, versions in needs.items()}
    return index


def _read_version_defs(image: _Image) -> tuple[str, ...]:
    """Names of the versions an object defines (its verdef table), without the base version (its soname)."""
    verdef = image.first(_SHT_GNU_VERDEF)
    if verdef is None:
        return ()
    data, strings, endian = image.data(verdef), image.linked(verdef), image.layout.endian
    names: list[str] = []
    # Elf_Verdef: vd_version, vd_flags, vd_ndx, vd_cnt, vd_hash, vd_aux, vd_next; Elf_Verdaux: vda_name, vda_next.
    for offset, (_, flags, _, count, _, aux, _) in _chain(data, verdef.info, endian + "HHHHIII", 6):
        if flags & 1 or count == 0:  # VER_FLG_BASE: the file's own name
            continue
        start = offset + aux
        if start + 8 > len(data):
            raise CorruptElf(f"a version definition at offset {offset} runs past its table")
        (name, _) = struct.unpack_from(endian + "II", data, start)
        names.append(_string(strings, name))
    return tuple(names)


def _read_versym(image: _Image) -> Sequence[int] | None:
    versym = image.first(_SHT_GNU_VERSYM)
    if versym is None:
        return None
    data = image.data(versym)
    return struct.unpack(f"{image.layout.endian}{len(data) // 2}H", data[:len(data) // 2 * 2])


def _read_symbols(data: bytes, strings: bytes, versym: Sequence[int] | None,
                  version_index: dict[int, tuple[str, str]], layout: _Layout, info: ElfDynamic) -> None:
    fmt = f"{layout.endian}IBBHQQ" if layout.wide else f"{layout.endian}IIIBBH"
    size = struct.calcsize(fmt)
    entries = struct.iter_unpack(fmt, memoryview(data)[:len(data) - len(data) % size])  # no copy
    if not layout.wide:  # Elf32_Sym orders its fields differently
        entries = ((name, st_info, other, shndx, value, value) for name, value, _, st_info, other, shndx in entries)
    text = strings.decode("latin-1")  # mangled names are ASCII; latin-1 never fails
    find, longest = text.find, MAX_NAME_BYTES + 1
    define = info.defined.add
    undefined = info.undefined.append
    versions = len(versym) if versym is not None else 0
    for position, (name_offset, st_info, other, shndx, _, _) in enumerate(entries):
        binding = st_info >> 4
        if binding == _STB_LOCAL or name_offset == 0 or position == 0 or name_offset >= len(text):
            continue
        end = find("\0", name_offset, name_offset + longest)  # bounded: inline, the loop runs per symbol
        name = text[name_offset:end if end >= 0 else _name_end(text, name_offset)]
        if shndx == _SHN_UNDEF:
            version = version_index.get(versym[position] & ~_VERSYM_HIDDEN) if position < versions else None
            undefined(UndefinedSymbol(name, binding == _STB_WEAK, *(version or (None, None))))
        elif other & 3 in (_STV_DEFAULT, _STV_PROTECTED):
            define(name)


# --- files -----------------------------------------------------------------------------------------------------


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
        raise unreadable_path(display or str(path), error) from None


def unreadable_path(display: str, error: OSError) -> ConfigError:
    return usage_error(f"cannot read {display}: {error.strerror or error}", rule=RULE_PATH,
                       hint="check its permissions (run as a user who can read the whole tree)")


def unreadable_elf(display: str, error: CorruptElf) -> ConfigError:
    return usage_error(f"{display} is not a readable ELF shared object: {error}", rule=RULE_ELF,
                       hint="the file is truncated or corrupt: reinstall the package it belongs to")


def read_elf_file(path: Path, display: str | None = None, *, summary: bool = False) -> ElfDynamic:
    """read_elf_dynamic (or read_link_summary) of a file; unreadable or corrupt files are usage errors naming
    display (or path)."""
    try:
        with open(path, "rb") as handle:
            return read_link_summary(handle) if summary else read_elf_dynamic(handle)
    except CorruptElf as error:
        raise unreadable_elf(display or str(path), error) from None
    except OSError as error:
        raise unreadable_path(display or str(path), error) from None
