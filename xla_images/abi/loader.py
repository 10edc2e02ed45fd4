"""A model of what glibc's dynamic loader does when python imports an extension beside torch: which libraries it
loads (the DT_NEEDED closure, breadth first, with DT_RPATH/DT_RUNPATH and $ORIGIN, then the system's directories),
in which order it looks symbols up, and which library provides each undefined symbol, or none.

The model, as `import torch; import EXTENSION` runs on Linux:

* The global scope comes first: the interpreter and its libraries (libc, libm, ...), then what torch loads with
  RTLD_GLOBAL (`torch/lib/libtorch_global_deps.so` and its closure) and, for torch_xla's `_XLAC`, torch_xla's CUDA
  stub where it is loaded (see `words.CUDA_STUB_PREFIX`). Python symbols (`Py*`, `_Py*`) come from the interpreter.
* Then the extension's local scope: itself and its DT_NEEDED closure in breadth-first load order, each name
  searched for as `Loader` says (glibc's order). A needed name that an already loaded library carries (torch's
  libraries, loaded by `import torch`; libraries the extension's package preloads by path, see
  `check.package_preloads`) is that library. A name found nowhere makes the import fail: `NotFound`.
* A symbol binds to the first library in that order that defines it (weak references may stay unbound), and each
  needed symbol version (GLIBCXX_3.4.30 of libstdc++.so.6 ...) must be defined by the library it names.

System libraries: for a site-packages on this machine (or inside an image, where the image checks run it) they are
this machine's; for an image read from outside (`build.py abi check IMAGE`) they are unknown (`SystemLibraries
(None)`), and symbols that would need them are judged by their names only.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .elf import ElfDynamic, is_elf, read_elf_file

# Where ld.so looks after the paths of the objects, when /etc/ld.so.conf names nothing else (x86_64 Debian/RHEL).
DEFAULT_DIRECTORIES: tuple[str, ...] = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                                        "/lib", "/usr/lib")
# What the python executable links (or has in itself): the head of every global scope.
INTERPRETER_LIBRARIES: tuple[str, ...] = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "libutil.so.1")
GLOBAL_DEPS = "libtorch_global_deps.so"
# torch/__init__.py (2.6-2.9) _load_global_deps: when libtorch_global_deps.so fails to load for a CUDA library, it
# preloads nvidia/<folder>/lib/<name>.so.* of the site by path, then retries; when it loads and libcudart is
# mapped, it preloads nvrtc and nvJitLink (cusparse and cudnn need them and carry no RPATH to them).
_CUDA_PRELOADS = {"cublas": "libcublas", "cudnn": "libcudnn", "cuda_nvrtc": "libnvrtc", "cuda_runtime": "libcudart",
                  "cuda_cupti": "libcupti", "cufft": "libcufft", "curand": "libcurand", "nvjitlink": "libnvJitLink",
                  "cusparse": "libcusparse", "cusparselt": "libcusparseLt", "cusolver": "libcusolver",
                  "nccl": "libnccl", "nvshmem": "libnvshmem_host", "cufile": "libcufile", "nvtx": "libnvToolsExt"}
_CUDA_RUNTIME_PRELOADS = {"cuda_nvrtc": "libnvrtc", "nvjitlink": "libnvJitLink"}
_LD_SO = "/lib64/ld-linux-x86-64.so.2"
_MAX_CONF_FILES = 256
_MAX_CONF_BYTES = 1 << 20


# What a DT_NEEDED path relative to nothing was "searched" in (ld.so opens it from the current directory).
RELATIVE_NEEDED = "the current directory of the importing process (a relative path)"


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
    """The target's system libraries by name; `SystemLibraries(None)` when they cannot be read.

    directories: the ld.so.cache / ld.so.conf directories, then the default ones (`configured_directories`);
    library_path: LD_LIBRARY_PATH of the process that imports (the caller's environment, or the image's ENV);
    lib: what `$LIB` expands to (Debian: lib/x86_64-linux-gnu, RHEL: lib64); platform: what `$PLATFORM` does
    (x86_64, haswell, xeon_phi: see host_platform)."""

    def __init__(self, directories: Sequence[str] | None, library_path: Sequence[str] = (), *,
                 lib: str = "lib/x86_64-linux-gnu", platform: str | None = None) -> None:
        self.directories = tuple(directories) if directories is not None else None
        self.library_path = tuple(library_path)
        self.lib = lib
        self.platform = platform or host_platform()

    @property
    def known(self) -> bool:
        return self.directories is not None

    def find(self, name: str) -> Path | None:
        return _first_in(self.directories or (), name)


@functools.lru_cache(maxsize=1)
def host_platform() -> str:
    """What this machine's ld.so puts for $PLATFORM. Not the kernel's AT_PLATFORM ("x86_64"): glibc's x86 startup
    replaces it by "haswell" or "xeon_phi" from the CPU's features, so ld.so is asked (`--list-diagnostics`, glibc
    2.33+; "haswell" on this machine kind); "x86_64" when it cannot say."""
    try:
        completed = subprocess.run([_LD_SO, "--list-diagnostics"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "x86_64"
    match = re.search(r'^dl_platform="([^"]+)"', completed.stdout, re.MULTILINE)
    return match.group(1) if match else "x86_64"


def library_path_of(environment: Mapping[str, str]) -> tuple[str, ...]:
    """LD_LIBRARY_PATH's directories as ld.so takes them: split on ':' and ';', empty entries meaning the current
    directory, which a static check cannot know: left out."""
    value = environment.get("LD_LIBRARY_PATH", "")
    return tuple(part for part in value.replace(";", ":").split(":") if part)


def _first_in(directories: Iterable[str], name: str) -> Path | None:
    for directory in directories:
        candidate = Path(directory, name)
        if _is_elf_file(candidate):
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


@dataclass(frozen=True)
class NotFound:
    """A DT_NEEDED name ld.so would find nowhere: the import fails with "cannot open shared object file"."""

    name: str
    needed_by: str
    searched: tuple[str, ...]  # the directories, in ld.so's order

    def __str__(self) -> str:
        where = ", ".join(self.searched) if self.searched else "no directory"
        return f"{self.name} (needed by {self.needed_by}; searched {where})"


@dataclass
class Scope:
    """An extension's lookup scope in the loader's order, and the needed libraries that could not be found."""

    libraries: list[Library]
    not_found: list[NotFound] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.not_found


class Loader:
    """Reads each library once; builds lookup scopes for the extensions of one site-packages, searching for each
    DT_NEEDED name as glibc's _dl_map_object does (elf/dl-load.c):

    1. a name with a '/' is a path ($ORIGIN expanded);
    2. an object already loaded under that name (its soname, or the name it was found by) is reused: torch's
       preloads (`preload`) and what the closure mapped before;
    3. unless the loading object has DT_RUNPATH: its DT_RPATH, then the DT_RPATH of the object that loaded it and
       so on up the chain (an object with DT_RUNPATH has no DT_RPATH: glibc drops it); python has none;
    4. LD_LIBRARY_PATH;
    5. the loading object's own DT_RUNPATH (never inherited);
    6. the ld.so.cache / ld.so.conf directories, then the default ones.
    No implicit $ORIGIN: a library beside the extension is found only through a search path naming it or a
    preload. glibc-hwcaps subdirectories and relative entries (relative to the importing process's current
    directory) are not modelled."""

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
        path = Path(os.path.normpath(path))  # "$ORIGIN/../x" shown as x (lexically: for display only)
        try:
            return str(path.relative_to(self.site))
        except ValueError:
            return str(path)

    def preload(self, roots: Iterable[Library]) -> list[Library]:
        """Load roots and their closures as `import torch` does: afterwards their sonames satisfy DT_NEEDED."""
        closure, _ = self.closure(list(roots))
        self.remember(closure)
        return closure

    def remember(self, libraries: Iterable[Library]) -> None:
        for library in libraries:
            self.loaded_by_soname.setdefault(library.name, library)
            self.loaded_by_soname.setdefault(library.path.name, library)

    def global_scope(self, torch_lib: Path, interpreter: Path | None = None
                     ) -> tuple[list[Library], list[NotFound]]:
        """The interpreter (the executable, its libpython and libc...; or, when it is not known, the libraries every
        python links), then what torch/__init__.py's _load_global_deps loads RTLD_GLOBAL (libtorch_global_deps.so
        and its closure), with the CUDA libraries it preloads by path; and the needed names found nowhere."""
        roots = [self.library(found) for found in map(self.system.find, INTERPRETER_LIBRARIES) if found is not None]
        if interpreter is not None:
            roots.insert(0, self.library(interpreter))
        deps = torch_lib / GLOBAL_DEPS
        if not deps.is_file():
            return self.closure(roots)
        order, not_found = self.closure([*roots, self.library(deps)])
        cuda = [item for item in not_found if item.name.split(".")[0] in _CUDA_PRELOADS.values()]
        if cuda:  # the `except OSError` branch: every nvidia/<folder>/lib/<library> is preloaded, then retried
            self.remember(self._nvidia(torch_lib, _CUDA_PRELOADS))
            order, not_found = self.closure([*roots, self.library(deps)])
        elif any(library.path.name.startswith("libcudart.so") for library in order):
            self.remember(self._nvidia(torch_lib, _CUDA_RUNTIME_PRELOADS))  # nvrtc, nvJitLink: RTLD_LOCAL
        self.remember(order)
        return order, not_found

    def _nvidia(self, torch_lib: Path, folders: Mapping[str, str]) -> list[Library]:
        """torch's _preload_cuda_deps: the first nvidia/<folder>/lib/<name>.so.N of the site, by path."""
        found = []
        for folder, name in folders.items():
            matches = sorted(glob.glob(str(torch_lib.parent.parent / "nvidia" / folder / "lib" / f"{name}.so.*")))
            found.extend(self.library(Path(match)) for match in matches[:1] if is_elf(Path(match)))
        return found

    def closure(self, roots: Sequence[Library], preloaded: Mapping[str, Library] | None = None
                ) -> tuple[list[Library], list[NotFound]]:
        """roots and everything they need, breadth first and each once, as the loader maps them; and the needed
        names found nowhere. preloaded: libraries the extension's own package loads by path before it."""
        order: list[Library] = []
        seen: set[str] = set()
        not_found: list[NotFound] = []
        mapped: dict[str, Library] = dict(preloaded or {})  # names the objects already mapped answer to
        # (library, the DT_RPATHs of the chain of objects that loaded it: l_loader, its l_loader...)
        queue: deque[tuple[Library, tuple[str, ...]]] = deque((root, ()) for root in roots)
        while queue:
            library, chain = queue.popleft()
            key = os.path.realpath(library.path)
            if key in seen:
                continue
            seen.add(key)
            order.append(library)
            mapped.setdefault(library.name, library)
            dynamic = library.summary()
            origin = str(library.path.parent)
            # What this object loads walks l_loader upwards: its own DT_RPATH (none when it has DT_RUNPATH), then
            # its loaders'. Its own needs use that chain only when it has no DT_RUNPATH.
            inherited = (*self._expand(() if dynamic.runpath else dynamic.rpath, origin), *chain)
            rpaths = () if dynamic.runpath else inherited
            runpath = self._expand(dynamic.runpath, origin)
            for needed in dynamic.needed:
                found, searched = self._find(needed, origin, rpaths, runpath, mapped)
                if found is None:
                    not_found.append(NotFound(needed, library.display, searched))
                    continue
                mapped.setdefault(needed, found)
                queue.append((found, inherited))
        return order, not_found

    def _find(self, needed: str, origin: str, rpaths: Sequence[str], runpath: Sequence[str],
              mapped: Mapping[str, Library]) -> tuple[Library | None, tuple[str, ...]]:
        if "/" in needed:
            expanded = self._expand((needed,), origin)
            if not expanded:  # `build/libbar.so` (linked by path, no soname): ld.so opens it from the process's
                return None, (RELATIVE_NEEDED,)  # current directory, whatever that is at import: not here
            path = Path(expanded[0])
            return (self.library(path) if path.is_file() else None), ()
        already = self.loaded_by_soname.get(needed) or mapped.get(needed)
        if already is not None:
            return already, ()
        directories = (*rpaths, *self.system.library_path, *runpath, *(self.system.directories or ()))
        found = _first_in(directories, needed)
        return (self.library(found) if found is not None else None), tuple(dict.fromkeys(directories))

    def _expand(self, entries: Sequence[str], origin: str) -> tuple[str, ...]:
        """$ORIGIN (${ORIGIN}), $LIB and $PLATFORM as ld.so expands them; relative entries are left out."""
        expanded = []
        for entry in entries:
            for token, value in (("ORIGIN", origin), ("LIB", self.system.lib), ("PLATFORM", self.system.platform)):
                entry = entry.replace("${" + token + "}", value).replace("$" + token, value)
            if entry.startswith("/"):
                expanded.append(entry)
        return tuple(expanded)


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


_TAGGED = re.compile(r"\.cpython-([0-9])([0-9]+)[a-z]*-")


@dataclass(frozen=True)
class Interpreter:
    """The python that imports: its executable (whose dynamic closure provides the C API) and its version."""

    path: Path
    version: tuple[int, int]

    @property
    def tag(self) -> str:
        return f"cpython-{self.version[0]}{self.version[1]}"


def find_interpreter(site: Path) -> Interpreter | None:
    """The python that imports from site: a venv's (pyvenv.cfg's `executable`, else bin/python3), the system
    python of a /usr/lib/python3.X or /usr/local/lib/python3.X site, else the caller's own (`sys.executable`)."""
    version = re.search(r"/python([0-9])\.([0-9]+)/", str(site) + "/")
    wanted = (int(version.group(1)), int(version.group(2))) if version else sys.version_info[:2]
    root = site.parents[2] if len(site.parents) > 2 else site
    name = f"python{wanted[0]}.{wanted[1]}"
    system = [root / "bin" / name, Path("/usr/local/bin", name), Path("/usr/bin", name)]
    # A site named by no python version (pip install --target DIR) is imported by the caller's python.
    candidates = [*_venv_executables(root), *(system if version else ()), Path(sys.executable), *system]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        named = re.fullmatch(r"python([0-9])\.([0-9]+)", real.name)
        found = (int(named.group(1)), int(named.group(2))) if named else (
            sys.version_info[:2] if real == Path(os.path.realpath(sys.executable)) else None)
        if found == wanted and _is_elf_file(real):
            return Interpreter(real, found)
    return None


def _is_elf_file(path: Path) -> bool:
    """A readable ELF file; False for what this user cannot see (another user's pyenv, a private directory)."""
    try:
        return path.is_file() and is_elf(path)
    except OSError:
        return False


def _venv_executables(root: Path) -> list[Path]:
    try:
        with open(root / "pyvenv.cfg", encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 16)
    except OSError:
        return []
    found = [Path(match.strip()) for match in re.findall(r"^executable\s*=\s*(.+)$", text, re.MULTILINE)]
    return [*found, root / "bin" / "python3"]


def built_for_other_python(file_name: str, interpreter: Interpreter) -> str | None:
    """The ABI tag of an extension's file name when it names another python (`.cpython-313-...so` beside 3.11):
    the import system never loads it (ModuleNotFoundError)."""
    match = _TAGGED.search(file_name)
    if match and (int(match.group(1)), int(match.group(2))) != interpreter.version:
        return f"cpython-{match.group(1)}{match.group(2)}"
    return None


def is_python_symbol(name: str) -> bool:
    """The interpreter (the executable, or libpython) provides the C API to every extension."""
    return name.startswith(("Py", "_Py"))
