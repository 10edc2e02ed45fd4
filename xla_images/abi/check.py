"""`check`: would torch_xla's `_XLAC` and every other extension linking torch load beside the torch of a
site-packages? Each extension's undefined symbols are judged in the load order `loader` models; the verdicts and
their words are in `verdict`.

A symbol the load order does not provide is an ``abi mismatch`` when some library exports its twin under the
other ABI (see `mangling.abi_neutral_key`), else a ``version mismatch``. When the order is incomplete (a needed
library was not found, or the system libraries are unknown: an image read from outside), a symbol found nowhere
is only blamed when it is one of torch's own entities or has a twin; the others are counted as unjudged.
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from .elf import ElfDynamic
from .headers import header_evidence, pybind11_internals, recorded_abi
from .files import WalkNotes, missing_path_error, walk_shared_objects
from .inspection import STD_REFERENCES_BASIS, classify_dynamic, outside_remark, package_abi
from .loader import Library, Loader, Scope, SymbolTable, SystemLibraries, configured_directories, \
    Interpreter, built_for_other_python, find_interpreter, is_python_symbol, library_path_of, \
    version_defined
from .mangling import REGISTERS_OPERATORS, TORCH_NAMESPACE_BYTES, abi_neutral_key, demangle, is_torch_entity, \
    symbol_abi
from .metadata import Distribution, distributions_of, installed_torch_version
from .verdict import CheckReport, ExtensionCheck, MissingSymbol, built_with, extension_verdict, site_verdict
from .words import ABI_LAYOUT, ABI_MISMATCH, COMPATIBLE, CUDA_STUB_PREFIX, CXX11, FROM_CUDA_STUB, LOADS, \
    MISSING_LIBRARY, PRE_CXX11, PYTHON_MISMATCH, UNCERTAIN, VERSION_MISMATCH, some, usage_error


def host_system() -> SystemLibraries:
    """This machine's system libraries (ld.so.conf, then the default directories), and the LD_LIBRARY_PATH of the
    caller's environment (the python that imports inherits it)."""
    return SystemLibraries(configured_directories("/"), library_path_of(os.environ))


def check_site_packages(path: Path, system: SystemLibraries | None = None, *,
                        display: str | None = None, also_inside: tuple[Path, ...] = ()) -> CheckReport:
    """Judge every extension under a site-packages (or a venv root holding one). system: the target's system
    libraries (default: this machine's); also_inside: trees outside the site whose directory links are followed
    (see walk_shared_objects)."""
    # Absolute before anything: $ORIGIN expands to the library's directory, and the loader (as ld.so) searches
    # absolute directories only, so a relative site turned every RUNPATH of torch_xla into "library not found".
    site = find_torch_site(Path(os.path.abspath(path)))
    return _check_site(site, display=display or str(path), system=system or host_system(), also_inside=also_inside)


def check_path_target(target: str) -> CheckReport:
    """The command line's path argument: a site-packages or a venv; anything else is a usage error."""
    path = Path(target).expanduser()
    if not path.exists():
        raise missing_path_error(path, "pass a site-packages directory or an image reference")
    if not path.is_dir():
        raise usage_error(f"{path} is not a directory",
                          hint="check needs torch and the extensions side by side: pass a site-packages "
                               "(e.g. `pip install --target DIR torch torch_xla` then DIR) or an image")
    return check_site_packages(path)


def find_torch_site(path: Path) -> Path:
    """path itself when it holds torch/lib, else the one lib/python3.*/site-packages under it (a venv root)."""
    if not path.is_dir():
        raise usage_error(f"{path} is not a directory", hint="pass a site-packages directory or a venv")
    if has_torch_libraries(path):
        return path
    candidates = [site for site in sorted(path.glob("lib/python3.*/site-packages")) if has_torch_libraries(site)]
    if len(candidates) == 1:
        return candidates[0]
    raise usage_error(f"no torch found in {path}",
                      hint="pass the site-packages directory that holds torch/lib/libtorch*.so "
                           "(e.g. VENV/lib/python3.11/site-packages)")


def has_torch_libraries(site: Path) -> bool:
    library = site / "torch" / "lib"
    return library.is_dir() and (any(library.glob("libtorch*.so*")) or any(library.glob("libc10*.so*")))


def _check_site(site: Path, *, display: str, system: SystemLibraries,
                also_inside: tuple[Path, ...] = ()) -> CheckReport:
    loader = Loader(site, system)
    notes = WalkNotes()
    torch, others = _split_site(site, loader, notes, also_inside)
    if not torch:
        raise usage_error(f"no torch library could be read under {site}{outside_remark(notes)}",
                          hint="pass the tree that holds torch/lib itself: directory links leading out of the tree "
                               "are not followed")
    loader.preload([library for library in torch if library.path.name.startswith("_C.")] or torch)
    torch_keys = {os.path.realpath(library.path) for library in torch}
    torch_names = {name for library in torch for name in (library.path.name, library.summary().soname) if name}
    twins = _TwinIndex(name for library in torch for name in library.symbols().defined)
    torch_abi = package_abi(classify_dynamic(library.symbols(), library.display) for library in torch)
    stub = next((library for relative, library in others if _is_cuda_stub(relative)), None)
    interpreter = find_interpreter(site) if system.known else None
    global_libraries, global_missing = loader.global_scope(site / "torch" / "lib",
                                                           interpreter.path if interpreter else None)
    torch_version = installed_torch_version(site)
    linking = [(relative, library) for relative, library in others if _links_torch(relative, library, torch_names)]
    owners = distributions_of(site, {relative for relative, _ in linking})
    extensions = []
    python_texts: dict[str, str] = {}
    pybind11_of: dict[str, str | None] = {}  # torch's internals id, read once when some extension needs it
    for relative, library in linking:
        local, not_found = loader.closure([library], package_preloads(site, relative, others, python_texts))
        scope = Scope(_unique([*global_libraries, *local]), [*global_missing, *not_found])
        scope_ok = scope.complete and system.known
        missing_library = system.known and not scope.complete
        uses_stub = stub if stub is not None and _loads_after_cuda_stub(relative) else None
        checked = _check_extension(relative, library, scope, scope_ok, torch_keys, twins, uses_stub, interpreter)
        checked = _with_distribution(checked, owners.get(relative), torch_version)
        if missing_library:  # ld.so stops at the first library it cannot open: nothing else matters
            checked = replace(checked, verdict=MISSING_LIBRARY)
        checked = _with_headers(checked, library, site / "torch" / "include", torch_version)
        checked = _with_layout(checked, library, torch_abi)
        extensions.append(checked if built_with(checked, torch_version)
                          else _with_pybind11(checked, library, torch, pybind11_of))
    extensions = _demangle_missing(extensions)
    verdict, summary = site_verdict(extensions, torch_abi, torch_version)
    summary += outside_remark(notes)
    return CheckReport(display, verdict, summary, torch_abi,
                       tuple(str(library.path.relative_to(site)) for library in torch), tuple(extensions),
                       torch_version, system.known)


def _split_site(site: Path, loader: Loader, notes: WalkNotes,
                also_inside: tuple[Path, ...]) -> tuple[list[Library], list[tuple[str, Library]]]:
    """(torch's own shared objects, (relative path, library) of every other one) under site."""
    torch: list[Library] = []
    others: list[tuple[str, Library]] = []
    for relative, full in walk_shared_objects(site, notes, also_inside):
        parts = Path(relative).parts
        library = loader.library(full)
        if parts[0] == "torch" and (len(parts) == 2 or parts[1] == "lib"):
            torch.append(library)
        elif parts[0] != "torch":
            others.append((relative, library))
    return torch, others


def package_preloads(site: Path, relative: str, others: Sequence[tuple[str, Library]],
                     texts: dict[str, str]) -> dict[str, Library]:
    """Libraries of the extension's own top-level package that its python code loads by path before importing it
    (torchaudio: `torch.ops.load_library(_get_lib_path("libtorchaudio"))`; ctypes.CDLL(...)): those whose file name
    without `.so` appears quoted in a .py file of the package. ld.so then finds them by soname; a library beside
    the extension that no code names is not loaded (no implicit $ORIGIN)."""
    package = Path(relative).parts[0]
    if package == relative:
        return {}
    if package not in texts:
        texts[package] = _python_text(site / package)
    text = texts[package]
    found: dict[str, Library] = {}
    for other, library in others:
        stem = os.path.basename(other).split(".so", 1)[0]
        if other != relative and other.startswith(package + "/") and re.search(
                rf"[\"'/]{re.escape(stem)}[\"'.]", text):
            found.setdefault(library.name, library)
            found.setdefault(library.path.name, library)
    return found


def _python_text(package: Path, limit: int = 64 << 20) -> str:
    """The python source of a package, bounded (a package is read for names, never whole beyond `limit`)."""
    parts, total = [], 0
    for path in sorted(package.rglob("*.py")):
        try:
            if not path.is_file():  # a fifo named *.py would block the open; a directory is no source
                continue
            with open(path, "rb") as handle:
                data = handle.read(max(limit - total, 0))
        except OSError:
            continue
        total += len(data)
        parts.append(data.decode("utf-8", "replace"))
        if total >= limit:
            break
    return "\n".join(parts)


def _unique(libraries: Sequence[Library]) -> list[Library]:
    seen: set[int] = set()
    return [library for library in libraries if not (id(library) in seen or seen.add(id(library)))]


def _links_torch(relative: str, library: Library, torch_names: set[str]) -> bool:
    """Is this an extension of torch? _XLAC always is; others DT_NEED a torch library or name torch symbols.

    DT_NEEDED alone is not enough: linked with --as-needed (Debian's default), an extension built with the
    other ABI than torch satisfies none of its symbols from libc10/libtorch, so the linker drops them.
    """
    summary = library.summary()
    return (os.path.basename(relative).startswith("_XLAC") or bool(torch_names.intersection(summary.needed))
            or TORCH_NAMESPACE_BYTES.search(summary.mentions) is not None)


def _is_cuda_stub(relative: str) -> bool:
    return "/" not in relative and relative.startswith(CUDA_STUB_PREFIX)


def _loads_after_cuda_stub(relative: str) -> bool:
    return "/" not in relative and relative.startswith("_XLAC") and not _is_cuda_stub(relative)


class _TwinIndex:
    """abi_neutral_key -> exported names, built only when some symbol is missing (usually never)."""

    def __init__(self, exported) -> None:
        self._exported = exported
        self._index: dict[str, list[str]] | None = None

    def find(self, name: str) -> str | None:
        if not name.startswith("_Z"):
            return None
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


def _check_extension(relative: str, library: Library, scope: Scope, scope_ok: bool, torch_keys: set[str],
                     twins: _TwinIndex, stub: Library | None, interpreter: Interpreter | None) -> ExtensionCheck:
    """Bind each undefined symbol of the extension in its scope's order, and each needed symbol version. The
    interpreter heads the scope when it is known: a C API symbol it lacks is a python mismatch."""
    dynamic = library.symbols()
    table = SymbolTable(scope.libraries)
    providers: dict[str, int] = {}
    missing: list[MissingSymbol] = []
    from_stub: list[MissingSymbol] = []
    judged = torch_bound = unjudged = 0
    for symbol in dynamic.undefined:
        if symbol.weak:
            continue  # a weak reference may stay unbound
        judged += 1
        provider = table.provider(symbol.name)
        if provider is not None:
            providers[provider.display] = providers.get(provider.display, 0) + 1
            torch_bound += os.path.realpath(provider.path) in torch_keys
            continue
        if is_python_symbol(symbol.name):
            if interpreter is None:  # judged by its name only
                providers["python"] = providers.get("python", 0) + 1
            else:
                missing.append(MissingSymbol(symbol.name, f"{symbol.name} (not in {interpreter.path}, "
                                             f"{interpreter.tag})", PYTHON_MISMATCH))
            continue
        if stub is not None and symbol.name in stub.symbols().defined:
            from_stub.append(MissingSymbol(symbol.name, symbol.name, FROM_CUDA_STUB))
            torch_bound += 1
            continue
        item = _judge_missing(symbol.name, scope_ok, twins)
        if item is None:
            unjudged += 1
            continue
        torch_bound += is_torch_entity(symbol.name) or item.problem == ABI_MISMATCH
        missing.append(item)
    missing.extend(_missing_versions(dynamic, table))
    other_python = built_for_other_python(os.path.basename(relative), interpreter) if interpreter else None
    if other_python:
        missing.append(MissingSymbol(other_python, f"file tagged {other_python}, this python is {interpreter.tag}: "
                                     f"`import` finds no module", PYTHON_MISMATCH))
    registers = any(REGISTERS_OPERATORS.match(symbol.name) for symbol in dynamic.undefined)
    return ExtensionCheck(
        relative, classify_dynamic(dynamic, relative).abi, extension_verdict(missing, None, None), torch_bound,
        tuple(sorted(missing, key=lambda item: (item.problem, item.symbol))),
        tuple(sorted(from_stub, key=lambda item: item.symbol)), registers_operators=registers, symbols=judged,
        providers=tuple(providers.items()), unjudged=unjudged,
        libraries_not_found=tuple(str(item) for item in scope.not_found))


def _judge_missing(name: str, scope_ok: bool, twins: _TwinIndex) -> MissingSymbol | None:
    """A symbol found nowhere in the scope: an ABI twin makes it an abi mismatch; otherwise a version mismatch when
    the scope is complete or the symbol is torch's own; None (unjudged) when the check cannot blame it."""
    twin = twins.find(name)
    if twin is not None:
        return MissingSymbol(name, name, ABI_MISMATCH, twin, twin)
    if scope_ok or is_torch_entity(name):
        return MissingSymbol(name, name, VERSION_MISMATCH)
    return None


def _missing_versions(dynamic: ElfDynamic, table: SymbolTable) -> list[MissingSymbol]:
    """Needed symbol versions that the library they name does not define: the loader refuses the object
    ("version `GLIBCXX_3.4.32' not found")."""
    found: list[MissingSymbol] = []
    for file, versions in dynamic.version_needs.items():
        library = table.named(file)
        if library is None:
            continue
        for version in versions:
            if version_defined(library, version) is False:
                found.append(MissingSymbol(version, f"version {version} of {file}", VERSION_MISMATCH))
    return found


def _with_distribution(extension: ExtensionCheck, owner: Distribution | None,
                       torch_version: str | None) -> ExtensionCheck:
    """Attach the owning distribution; one pinned to another torch X.Y whose symbols all resolve is uncertain
    (torchvision 0.23.0, pinned to torch 2.8.0, crashes with SIGSEGV beside 2.9.0 registering its operators; others
    pinned elsewhere work: benchmarks/abi_corpus), a pin mismatch when only the patch differs."""
    if owner is None:
        return extension
    verdict = extension_verdict(extension.missing, owner.requires_torch, torch_version)
    return replace(extension, verdict=verdict, distribution=str(owner), requires_torch=owner.requires_torch)


def _with_headers(extension: ExtensionCheck, library: Library, include: Path,
                  torch_version: str | None) -> ExtensionCheck:
    """For an extension neither pinned nor built together with this torch: the headers it was compiled against.
    One that registers operators and whose registration headers differ from this torch's is a version mismatch (a
    custom extension compiled against torch 2.8 aborts while registering its operators beside 2.9); assertions that
    only moved a few lines, and differences elsewhere, are reported (a custom class compiled against 2.6, beside
    2.7, works: ivalue.h:1315 is 1317 there; see headers.DRIFT_LINES)."""
    if extension.requires_torch is not None or built_with(extension, torch_version):
        return extension
    evidence = header_evidence(library.path, include)
    if evidence is None:
        return extension
    verdict = extension.verdict
    if verdict == COMPATIBLE and extension.registers_operators and evidence.registration_differing:
        verdict = UNCERTAIN  # measured both ways (benchmarks/abi_corpus): the headers' lines do not decide
    return replace(extension, verdict=verdict, headers=evidence.verdict, header_sites=evidence.sites,
                   header_differences=evidence.differing, header_moved=evidence.moved)


def _with_layout(extension: ExtensionCheck, library: Library, torch_abi: str) -> ExtensionCheck:
    """An extension that loads but was compiled with the other _GLIBCXX_USE_CXX11_ABI than torch: every symbol may
    resolve (ABI-neutral names: c10::Dispatcher::findSchema(c10::OperatorName const&) passes a std::string inside
    a struct), and the first call reads a string of the other layout (SIGSEGV). Judged from the evidence in the
    binary (`own_abi`)."""
    if extension.verdict not in (*LOADS, UNCERTAIN) or torch_abi not in (CXX11, PRE_CXX11):
        return extension
    handed = [symbol.name for symbol in library.symbols().undefined
              if is_torch_entity(symbol.name) and _TAKES_TORCH_OBJECT.search(symbol.name)]
    if not handed:  # strings used only inside (std::ostringstream beside a torch of the other ABI works)
        return extension
    own = own_abi(library)
    if own is None or own[0] == torch_abi:
        return extension
    shown = demangle(handed[:2])
    return replace(extension, verdict=ABI_LAYOUT, layout_evidence=(
        f"{own[0]}: {own[1]}; torch is {torch_abi}; it hands torch objects to "
        f"{some([shown.get(name, name) for name in handed], 2)}"))


# A torch function taking a torch object (by reference, pointer or value) among its parameters: the nested name
# ends at the first "E" after _ZN..., and a parameter naming a class of torch's namespaces (or a substitution of
# one) follows. Objects hold strings (c10::OperatorName, FunctionSchema, Argument...), whose layout follows the ABI.
_TAKES_TORCH_OBJECT = re.compile(r"^_ZN[^E]*E.*?[RPO]?K?N(?:S[0-9A-Z]*_|3c10|2at|5torch|4c10d)[0-9]")


# typeinfo of a class or enum in torch's namespaces (_ZTIN3c1011DispatchKeyE): pybind11 looks registered types up by
# typeid. Exceptions are left out: catching c10::Error needs its typeinfo and exchanges nothing.
_TORCH_TYPEINFO = re.compile(r"^_ZTIN(?:3c10|2at|5torch|4c10d|6caffe2)[0-9]")


def _with_pybind11(extension: ExtensionCheck, library: Library, torch: Sequence[Library],
                   cache: dict[str, str | None]) -> ExtensionCheck:
    """A pybind11 module whose internals differ from torch's and that exchanges a type torch binds (its typeinfo
    is referenced or emitted in the module): pybind11_mismatch. One that shares no such type is left alone, and so
    is one built with this torch release (the caller's `built_with`): torch_xla 2.6's _XLAC carries another
    compiler's internals id (cxxabi1014 against torch's cxxabi1011) and uses the typeinfo of 94 torch types, yet
    upstream builds and tests the pair together and it works (seen in the r2.6.0 image) — typeinfo alone does not
    show a pybind11 cast of a bound type, so the rule is kept for extensions built elsewhere."""
    if extension.verdict not in LOADS:
        return extension
    dynamic = library.symbols()
    names = [*dynamic.defined, *(symbol.name for symbol in dynamic.undefined)]
    shared = sorted(name for name in names if _TORCH_TYPEINFO.match(name) and "Error" not in name
                    and "Exception" not in name)
    if not shared:
        return extension
    own = pybind11_internals(library.path)
    if "torch" not in cache:
        python = next((item for item in torch if item.path.name.startswith("libtorch_python")), None)
        cache["torch"] = pybind11_internals(python.path) if python is not None else None
    if own is None or cache["torch"] is None or own == cache["torch"]:
        return extension
    entities = ["_Z" + name[len("_ZTI"):] for name in shared]  # the type itself: c10::DispatchKey
    readable = demangle(entities)
    types = some([readable.get(entity, entity) for entity in entities], 2)
    # Uncertain, not a mismatch: six mixes of the field test exchanging torch types across other internals worked
    # (a conversion fails only where a call really converts a bound type; the typeinfo does not show that).
    return replace(extension, verdict=UNCERTAIN,
                   pybind11_evidence=f"its pybind11 internals ({own}) are not torch's ({cache['torch']}) and it "
                                     f"exchanges torch's types ({types})")


def own_abi(library: Library) -> tuple[str, str] | None:
    """The ABI an extension's own code was compiled with, and the evidence: the recorded build flag; else its
    symbols, when they show one ABI (interface, std instantiations or references into libstdc++: see
    inspection.SharedObjectReport); else C++11-ABI type names in its strings. None when nothing shows one."""
    report = classify_dynamic(library.symbols(), library.display)
    decided = report.abi in (CXX11, PRE_CXX11)
    if decided and report.abi_basis != STD_REFERENCES_BASIS:  # cheap and decisive: no need to read the binary
        return report.abi, f"its symbols ({report.abi_basis}) use the {report.abi} ABI"
    recorded = recorded_abi(library.path)
    if recorded is not None and recorded[1].startswith("built with"):
        return recorded
    if decided:
        return report.abi, f"its references into libstdc++ use the {report.abi} ABI"
    return recorded


def _demangle_missing(extensions: list[ExtensionCheck]) -> list[ExtensionCheck]:
    names = {name for extension in extensions for item in (*extension.missing, *extension.from_cuda_stub)
             for name in (item.symbol, item.twin) if name and item.symbol == item.demangled}
    readable = demangle(sorted(names))

    def readable_items(items: Sequence[MissingSymbol]) -> tuple[MissingSymbol, ...]:
        return tuple(MissingSymbol(item.symbol, readable.get(item.demangled, item.demangled), item.problem,
                                   item.twin, readable.get(item.twin, item.twin) if item.twin else None)
                     for item in items)

    return [replace(extension, missing=readable_items(extension.missing),
                    from_cuda_stub=readable_items(extension.from_cuda_stub)) for extension in extensions]
