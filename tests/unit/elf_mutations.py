"""Structure-aware mutations of a real shared object, shared by the ELF fuzz of tests/unit/test_abi_hostile.py
(derandomized, fixed budget) and benchmarks/fuzz_abi_elf.py (random, time budget, prints what it found).

A mutation is drawn from a `random.Random`: in the test, hypothesis supplies one (`st.randoms()`), so the examples
are derandomized and shrinkable; in the benchmark a seeded one, so a finding can be replayed from its seed.
"""
from __future__ import annotations

import hashlib
import random
import struct
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abi"

SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name type flags addr offset size link info addralign entsize
VERDEF, VERNEED = 0x6FFFFFFD, 0x6FFFFFFE
SECTION_TYPES = {6: "dynamic", 11: "dynsym", VERDEF: "verdef", VERNEED: "verneed", 0x6FFFFFFF: "versym"}
# Offsets inside Elf64_Ehdr of e_shoff, e_shentsize, e_shnum, e_shstrndx.
HEADER_FIELDS = ((0x28, 8), (0x3A, 2), (0x3C, 2), (0x3E, 2))
# Offsets inside Elf64_Shdr of sh_offset, sh_size, sh_link, sh_info, sh_entsize.
SECTION_FIELDS = ((0x18, 8), (0x20, 8), (0x28, 4), (0x2C, 4), (0x38, 8))
KINDS = ("field values", "byte flips", "truncation", "garbage after the magic", "version chain",
         "string table without NULs")


def compile_library(source: str, output: Path, *flags: str) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", f"-I{FIXTURES}", str(FIXTURES / source), "-o",
                    str(output), *flags], check=True, capture_output=True, text=True)
    return output


def fixed_bytes(size: int, label: str) -> bytes:
    """size bytes that look random but are the same on every run (tests are deterministic)."""
    blocks = (hashlib.sha256(f"{label}:{number}".encode()).digest() for number in range(size // 32 + 1))
    return b"".join(blocks)[:size]


def set_field(data: bytearray, offset: int, width: int, value: int) -> None:
    data[offset:offset + width] = (value % (1 << (8 * width))).to_bytes(width, "little")


def section_headers(data: bytes) -> list[tuple[int, tuple]]:
    """(offset of the header, its fields) of every section header of a well-formed ELF64 little-endian seed."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, = struct.unpack_from("<H", data, 0x3C)
    return [(shoff + index * SHDR.size, SHDR.unpack_from(data, shoff + index * SHDR.size)) for index in range(shnum)]


def field_offsets(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the ELF header fields and of the section header fields of the dynamic tables."""
    fields = list(HEADER_FIELDS)
    for start, header in section_headers(data):
        if header[1] in SECTION_TYPES:
            fields.extend((start + offset, width) for offset, width in SECTION_FIELDS)
    return fields


def version_chain(seed: bytes, *, size: int, count: int = 0xFFFFFFFF, next_offset: int = 0,
                  kind: int = VERNEED) -> bytes:
    """The seed with its version-need (or version-definition) table claiming `size` bytes and `count` entries, the
    first entry's `next` set to next_offset: issue 19's case is a size past the end of the file with a next of 0,
    which revisits one entry for as long as the count lets it."""
    data = bytearray(seed)
    for start, header in section_headers(seed):
        if header[1] == kind:
            set_field(data, start + 0x20, 8, size)
            set_field(data, start + 0x2C, 4, count)
            # vn_next is at +12 of Elf_Verneed; vd_next at +16 of Elf_Verdef.
            set_field(data, header[4] + (12 if kind == VERNEED else 16), 4, next_offset)
            return bytes(data)
    raise ValueError("the seed has no such version table")


def with_version_needs(seed: bytes, count: int) -> bytes:
    """The seed with its version-need table replaced by `count` records (one Elf_Vernaux each) appended at the end
    of the file, all naming the seed's first needed library and version."""
    data = bytearray(seed)
    for start, header in section_headers(seed):
        if header[1] == VERNEED:
            _, _, file_name, aux, _ = struct.unpack_from("<HHIII", seed, header[4])
            hashed, flags, other, name, _ = struct.unpack_from("<IHHII", seed, header[4] + aux)
            table = bytearray()
            for number in range(count):
                table += struct.pack("<HHIII", 1, 1, file_name, 16, 32 if number + 1 < count else 0)
                table += struct.pack("<IHHII", hashed, flags, other, name, 0)
            offset = (len(data) + 7) // 8 * 8
            data += bytes(offset - len(data)) + table
            set_field(data, start + 0x18, 8, offset)
            set_field(data, start + 0x20, 8, len(table))
            set_field(data, start + 0x2C, 4, count)
            return bytes(data)
    raise ValueError("the seed has no version needs")


def mutate(seed: bytes, rng: random.Random) -> tuple[str, bytes]:
    """(kind, bytes) of one mutation of seed."""
    kind = rng.choice(KINDS)
    if kind == "field values":
        data, fields = bytearray(seed), field_offsets(seed)
        extremes = [0, 1, 2, 15, 16, 17, 0xFF, 0xFFFF, 0xFFFFFFFF, len(seed), len(seed) * 2, (1 << 63) - 1,
                    (1 << 64) - 1]
        for _ in range(rng.randint(1, 4)):
            offset, width = rng.choice(fields)
            set_field(data, offset, width, rng.choice(extremes) if rng.random() < 0.6 else rng.getrandbits(64))
        return kind, bytes(data)
    if kind == "byte flips":
        data = bytearray(seed)
        for _ in range(rng.randint(1, 32)):
            data[rng.randint(4, len(data) - 1)] = rng.randint(0, 255)
        return kind, bytes(data)
    if kind == "truncation":
        return kind, seed[:rng.randint(4, len(seed) - 1)]
    if kind == "garbage after the magic":
        return kind, b"\x7fELF" + rng.randbytes(rng.randint(0, 8192))
    if kind == "string table without NULs":  # issue 41: every name ran to the table's end, one copy each
        size = rng.choice([1, 64, 70_000, 1 << 20])
        return kind, with_string_table(seed, bytes(rng.randint(1, 255) for _ in range(min(size, 4096))) * (
            size // 4096 + 1))
    tables = [header[1] for _, header in section_headers(seed) if header[1] in (VERNEED, VERDEF)]
    if not tables:
        return kind, seed
    sizes = [len(seed) * 2, len(seed) + 1, 1 << 36, rng.getrandbits(40), 16]
    return kind, version_chain(seed, size=rng.choice(sizes), count=rng.choice([2, 0xFFFF, 0xFFFFFFFF]),
                               next_offset=rng.choice([0, 0, 16, 0xFFFFFFF0]), kind=rng.choice(tables))


def with_string_table(seed: bytes, table: bytes) -> bytes:
    """The seed with the string table its .dynsym links to (its .dynstr, shared by the dynamic section and the
    version tables) replaced by `table`, appended at the end of the file. The symbols keep their name offsets."""
    data = bytearray(seed)
    headers = section_headers(seed)
    dynsym = next(header for _, header in headers if header[1] == 11)
    start = headers[dynsym[6]][0]
    offset = (len(data) + 7) // 8 * 8
    data += bytes(offset - len(data)) + table
    set_field(data, start + 0x18, 8, offset)
    set_field(data, start + 0x20, 8, len(table))
    return bytes(data)
