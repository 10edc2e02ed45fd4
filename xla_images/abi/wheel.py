"""Read the shared objects and the platform tags of a wheel without unpacking it, bounded against zip bombs.

zipfile never inflates past a member's declared file_size (a liar fails its CRC), so refusing members declared
beyond any real library, or inflating like a bomb, bounds the time, memory and disk one member can cost.
"""
from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .elf import ELF_MAGIC, CorruptElf, ElfDynamic, read_elf_dynamic, unreadable_elf, unreadable_path
from .files import SHARED_OBJECT_NAME
from .words import RULE_PATH, RULE_WHEEL, reason, usage_error

# Members bigger than this are unpacked to a temporary file instead of memory when reading a wheel.
IN_MEMORY_LIMIT = 256 << 20
# Bounds on what one wheel member may cost. The biggest real member seen is torch 2.8's libtorch_cuda.so (1.0 GB,
# 3.4x compressed); the best compressed members of real torch wheels are headers at 25x, shared objects 3-6x.
MAX_MEMBER_BYTES = 4 << 30
BOMB_RATIO, BOMB_MIN_BYTES = 200, 16 << 20
MAX_METADATA_BYTES = 16 << 20  # WHEEL, METADATA, RECORD


def read_wheel(path: Path) -> tuple[list[tuple[str, ElfDynamic]], list[str]]:
    """(member name, dynamic tables) of each ELF shared object in the wheel, and the platform parts of its WHEEL
    file's tags; a damaged wheel is a usage error naming it (and the member)."""
    try:
        archive = zipfile.ZipFile(path)
    except OSError as error:
        raise unreadable_path(str(path), error) from None
    except Exception as error:  # noqa: BLE001 - BadZipFile, ValueError, EOFError ... for a damaged archive
        raise usage_error(f"{path} is not a readable wheel (zip): {reason(error)}", rule=RULE_WHEEL,
                          hint="download it again: the file is truncated or not a zip archive") from None
    with archive:
        libraries = [(member.filename, _read_member(path, archive, member)) for member in archive.infolist()
                     if SHARED_OBJECT_NAME.search(member.filename) and _member_is_elf(path, archive, member)]
        return libraries, _wheel_file_tags(path, archive)


@contextmanager
def _member_errors(wheel: Path, member: zipfile.ZipInfo) -> Iterator[None]:
    """A member that cannot be decompressed (bad CRC, truncated data, encrypted, unknown method) names itself."""
    try:
        yield
    except CorruptElf as error:
        raise unreadable_elf(f"{wheel}!{member.filename}", error) from None
    except OSError as error:  # the wheel itself became unreadable, or the spool's disk is full
        raise usage_error(f"cannot read {wheel}!{member.filename}: {error.strerror or error}",
                          rule=RULE_PATH) from None
    except Exception as error:  # noqa: BLE001 - zipfile/zlib raise BadZipFile, zlib.error, EOFError, RuntimeError...
        raise usage_error(f"{wheel}!{member.filename} cannot be decompressed: {reason(error)}", rule=RULE_WHEEL,
                          hint="download the wheel again: it is truncated or corrupt") from None


def _check_member_size(wheel: Path, member: zipfile.ZipInfo, limit: int | None = None) -> None:
    """Refuse members whose declared size is beyond any real library, or that inflate like a zip bomb.

    zipfile never inflates past the declared file_size (a liar fails its CRC), so these two bounds bound
    the time, memory and disk a member can cost."""
    limit = MAX_MEMBER_BYTES if limit is None else limit
    if member.file_size > limit:
        raise usage_error(f"{wheel}!{member.filename} declares {member.file_size} bytes uncompressed, more than "
                          f"the {limit} bytes allowed", rule=RULE_WHEEL,
                          hint="no real shared object is that large: the wheel is corrupt or hostile")
    if member.file_size > BOMB_MIN_BYTES and member.file_size > BOMB_RATIO * max(member.compress_size, 1):
        raise usage_error(f"{wheel}!{member.filename} inflates {member.compress_size} bytes to {member.file_size} "
                          f"(more than {BOMB_RATIO}x): a zip bomb, not a shared object", rule=RULE_WHEEL,
                          hint="real shared objects compress 3-6x; the wheel is corrupt or hostile")


def _member_is_elf(wheel: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> bool:
    with _member_errors(wheel, member), archive.open(member) as handle:
        return handle.read(4) == ELF_MAGIC


def _read_member(wheel: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> ElfDynamic:
    """Decompress one member (to memory, or a temp file when big) and read it: the ELF reader (elf.py) seeks."""
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
