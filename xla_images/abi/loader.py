"""A model of what glibc's dynamic loader does when python imports an extension beside torch: which libraries it
loads (the DT_NEEDED closure, breadth first, with DT_RPATH/DT_RUNPATH and $ORIGIN, then the system's directories),
in which order it looks symbols up, and which library provides each undefined symbol, or none.

The model, as `import torch; import EXTENSION` runs on Linux:

* The global scope comes first: the interpreter and its libraries (libc, libm, ...), then what torch loads with
  RTLD_GLOBAL (`torch/lib/libtorch_global_deps.so` and its closure) and, for torch_xla's `_XLAC`, torch_xla's CUDA
  stub where it is loaded (see `words.CUDA_STUB_PREFIX`). Python symbols (`Py*`, `_Py*`) come from the interpreter.
* Then the extension's local scope: itself and its DT_NEEDED closure in breadth-first load order. A needed name
  that an already loaded library carries as its soname (torch's libraries, loaded by `import torch`) is that library;
  a name is otherwise looked for in the loading object's DT_RPATH (when it has no DT_RUNPATH; an RPATH is inherited
  by what its object loads), its DT_RUNPATH, then the system directories (ld.so.conf, then the defaults). As the
  loader does, libraries a package preloads by path (ctypes, torch.ops.load_library) are found by name when they
  sit in the extension's own directory.
* A symbol binds to the first library in that order that defines it (weak references may stay unbound), and each
  needed symbol version (GLIBCXX_3.4.30 of libstdc++.so.6 ...) must be defined by the library it names.

System libraries: for a site-packages on this machine (or inside an image, where the image checks run it) they are
this machine's; for an image read from outside (`build.py abi check IMAGE`) they are unknown (`SystemLibraries
(None)`), and symbols that would need them are judged by their names only.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from .elf import ElfDynamic, is_elf, read_elf_file

# Where ld.so looks after the paths of the objects, when /etc/ld.so.conf names nothing else (x86_64 Debian/RHEL).
DEFAULT_DIRECTORIES: tuple[str, ...] = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                                        "/lib", "/usr/lib")
# What the python executable links (or has in itself): the head of every global scope.
INTERPRETER_LIBRARIES: tuple[str, ...] = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "libutil.so.1")
GLOBAL_DEPS = "libtorch_global_deps.so"
_MAX_CONF_FILES = 256
_MAX_CONF_BYTES = 1 << 20


def configured_directories(root: str = "/") -> tuple[str, ...]:
    """The directories of /etc/ld.so.conf under root, its `include`s read where they stand (as ldconfig reads
    them), then the defaults. Each file is read once and bounded: a cycle of includes or a huge file cannot hang."""
    found: list[str] = []
    _read_conf(root, os.path.join(root, "etc/ld.so.conf"), found, set())
    found.extend(os.path.join(root, directory.lstrip("/")) for directory in DEFAULT_DIRECTORIES)
    return tuple(dict.fromkeys(found))


def _read_conf(root: str, name: str, found: list[str], seen: set[str]) -> None:
    if name in seen or len(seen) >= _MAX_CONF_FILES:
        return
    seen.add(name)
    try:
        with open(name, "rb") as handle:
            text = handle.read(_MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include "):
            pattern = line.split(None, 1)[1]
            for included in sorted(glob.glob(os.path.join(root, pattern.lstrip("/")))):
                _read_conf(root, included, found, seen)
        elif line.startswith("/"):
            found.append(os.path.join(root, line.lstrip("/")))


class SystemLibraries:
    """The target's system libraries by name; `SystemLibraries(None)` when they cannot be read."""

    def __init__(self, directories: Sequence[str] | None) -> None:
        self.directories = tuple(directories) if directories is not None else None

    @property
    def known(self) -> bool:
        return self.directories is not None

    def find(self, name: str) -> Path | None:
        for directory in self.directories or ():
            candidate = Path(directory, name)
            if candidate.is_file() and is_elf(candidate):
                return candidate
        return None


@dataclass
class Library:
    """One loaded object: where it is, how to show it, and its dynamic tables (read once, on first use)."""

    path: Path
    display: str
    _dynamic: ElfDynamic | None = None
    _full: bool = False

    def summary(self) -> ElfDynamic:
        if self._dynamic is None:
            self._dynamic = read_elf_file(self.path, self.display, summary=True)
        return self._dynamic

    def symbols(self) -> ElfDynamic:
        if not self._full:
            self._dynamic = read_elf_file(self.path, self.display)
            self._full = True
        return self._dynamic

    @property
    def name(self) -> str:
        return self.summary().soname or self.path.name


@dataclass
class Scope:
    """An extension's lookup scope in the loader's order, and the needed libraries that could not be found."""

    libraries: list[Library]
    not_found: list[tuple[str, str]] = field(default_factory=list)  # (library name, needed by)

    @property
    def complete(self) -> bool:
        return not self.not_found


class Loader:
    """Reads each library once; builds lookup scopes for the extensions of one site-packages."""

    def __init__(self, site: Path, system: SystemLibraries) -> None:
        self.site = site
        self.system = system
        self._libraries: dict[str, Library] = {}
        self.loaded_by_soname: dict[str, Library] = {}

    def library(self, path: Path) -> Library:
        key = os.path.realpath(path)
        if key not in self._libraries:
            self._libraries[key] = Library(path, self._show(path))
        return self._libraries[key]

    def _show(self, path: Path) -> str:
        """Relative to the site-packages for its own files (as `check` names extensions), else the full path."""
        try:
            return str(path.relative_to(self.site))
        except ValueError:
            return str(path)

    def preload(self, roots: Iterable[Library]) -> list[Library]:
        """Load roots and their closures as `import torch` does: afterwards their sonames satisfy DT_NEEDED."""
        closure, _ = self.closure(list(roots))
        for library in closure:
            self.loaded_by_soname.setdefault(library.name, library)
            self.loaded_by_soname.setdefault(library.path.name, library)
        return closure

    def global_scope(self, torch_lib: Path) -> tuple[list[Library], list[tuple[str, str]]]:
        """The interpreter's libraries, then torch's RTLD_GLOBAL dependencies, with their closure; and the needed
        names found nowhere."""
        roots: list[Library] = []
        for name in INTERPRETER_LIBRARIES:
            found = self.system.find(name)
            if found is not None:
                roots.append(self.library(found))
        deps = torch_lib / GLOBAL_DEPS
        if deps.is_file():
            roots.append(self.library(deps))
        return self.closure(roots)

    def closure(self, roots: Sequence[Library], extra_directories: Sequence[str] = ()
                ) -> tuple[list[Library], list[tuple[str, str]]]:
        """roots and everything they need, breadth first and each once, as the loader maps them; and the needed
        names found nowhere (name, needed by)."""
        order: list[Library] = []
        seen: set[str] = set()
        not_found: list[tuple[str, str]] = []
        # (library, RPATHs inherited from the objects that loaded it)
        queue: list[tuple[Library, tuple[str, ...]]] = [(root, ()) for root in roots]
        while queue:
            library, inherited = queue.pop(0)
            key = os.path.realpath(library.path)
            if key in seen:
                continue
            seen.add(key)
            order.append(library)
            dynamic = library.summary()
            origin = str(library.path.parent)
            own_rpath = () if dynamic.runpath else _expand(dynamic.rpath, origin)
            rpaths = (*own_rpath, *inherited)
            for needed in dynamic.needed:
                found = self._find(needed, rpaths, _expand(dynamic.runpath, origin), extra_directories)
                if found is None:
                    not_found.append((needed, library.display))
                else:
                    queue.append((found, rpaths))
        return order, not_found

    def _find(self, needed: str, rpaths: Sequence[str], runpath: Sequence[str],
              extra_directories: Sequence[str]) -> Library | None:
        if "/" in needed:
            path = Path(needed)
            return self.library(path) if path.is_file() else None
        if needed in self.loaded_by_soname:
            return self.loaded_by_soname[needed]
        for directory in (*rpaths, *runpath):
            candidate = Path(directory, needed)
            if candidate.is_file() and is_elf(candidate):
                return self.library(candidate)
        found = self.system.find(needed)
        if found is not None:
            return self.library(found)
        for directory in extra_directories:
            candidate = Path(directory, needed)
            if candidate.is_file() and is_elf(candidate):
                return self.library(candidate)
        return None


def _expand(entries: Sequence[str], origin: str) -> tuple[str, ...]:
    return tuple(entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for entry in entries)


class SymbolTable:
    """First-definition lookup over a scope; a library's symbols are read when a lookup first reaches it."""

    def __init__(self, libraries: Sequence[Library]) -> None:
        self.libraries = list(libraries)

    def provider(self, name: str) -> Library | None:
        for library in self.libraries:
            if name in library.symbols().defined:
                return library
        return None

    def named(self, name: str) -> Library | None:
        """The library of the scope that a versioned reference names (by soname or file name)."""
        return next((library for library in self.libraries if name in (library.name, library.path.name)), None)


def version_defined(library: Library, version: str) -> bool | None:
    """Does the library define that symbol version? None when it defines none (glibc then only warns)."""
    versions = library.symbols().version_defs
    return None if not versions else version in versions


def is_python_symbol(name: str) -> bool:
    """The interpreter (the executable, or libpython) provides the C API to every extension."""
    return name.startswith(("Py", "_Py"))
