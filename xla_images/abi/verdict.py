"""What `check` found, and the words of its verdicts: per extension and for a whole site-packages.

Verdicts (a prediction of the real import; exit codes of `abi check`):

* ``compatible`` (exit 0): every undefined symbol binds to a library the loader would load, and nothing in the
  metadata says the extension was built for another torch release.
* ``pin mismatch`` (exit 0): the same, but its distribution pins another patch release of this X.Y torch
  (torchvision 0.22.1 pins torch==2.7.1; beside 2.7.0 it loads and runs). pip would refuse the set; the loader
  does not.
* ``abi mismatch`` (exit 1): symbols are exported only with the other `_GLIBCXX_USE_CXX11_ABI` mangling.
* ``missing library`` (exit 1): a DT_NEEDED library of the extension (or of what it loads, or of torch's global
  dependencies) is found nowhere in ld.so's search order: the import fails with "cannot open shared object file".
* ``abi mismatch (layout)`` (exit 1): every symbol resolves, but the extension's own code was compiled with the
  other `_GLIBCXX_USE_CXX11_ABI` (evidence: its recorded build flag, its symbols, its strings).
* ``pybind11 mismatch`` (exit 1): a pybind11 module built with other pybind11 internals than torch's that exchanges
  a type torch binds (its typeinfo is in the module): the call converting it fails.
* ``python mismatch`` (exit 1): the python that imports does not export a C API symbol the extension needs, or
  the extension's file is tagged for another python (cpython-313 beside 3.11).
* ``version mismatch`` (exit 1): symbols (or symbol versions) exported by nothing in the load order, under either
  ABI.
* ``uncertain`` (exit 3): every symbol binds, but a heuristic doubts that it works: the distribution pins another
  X.Y torch release, or an unpinned extension registering operators was compiled against another torch's
  registration headers, or a pybind11 module with other internals than torch's exchanges a torch type. Measured on
  real wheels (benchmarks/abi_corpus, docs/abi.md) each of these was wrong on some mixes, so none is a mismatch:
  the evidence is reported and the import has to be tried.

A mismatch verdict (exit 1) rests on what the loader or the import system will refuse: a library found nowhere, a
needed non-weak symbol or symbol version defined by nothing in the load set, a file tagged for another python -
or on the extension's own code compiled with the other C++ ABI and handing torch objects to torch
(``abi mismatch (layout)``, measured to crash).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .headers import OTHER
from .mangling import is_torch_entity
from .metadata import same_minor, same_release
from .words import (ABI_LAYOUT, ABI_MISMATCH, COMPATIBLE, CUDA_STUB_PREFIX, LOADS, MISSING_LIBRARY, PIN_MISMATCH,
                    PYBIND11_MISMATCH, PYTHON_MISMATCH, UNCERTAIN, VERSION_MISMATCH, some)


@dataclass(frozen=True)
class MissingSymbol:
    """An undefined symbol (or needed symbol version) of an extension that nothing in its load order provides."""

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
    """One extension module (or plugin) linking torch, where its symbols bind, and what would fail to bind."""

    path: str
    abi: str
    verdict: str
    torch_symbols: int  # undefined symbols bound to torch's libraries, or missing and judged as torch's
    missing: tuple[MissingSymbol, ...] = ()
    from_cuda_stub: tuple[MissingSymbol, ...] = ()  # not in torch, bound to torch_xla's CUDA stub instead
    distribution: str | None = None  # "torchvision 0.23.0": the installed distribution whose RECORD lists it
    requires_torch: str | None = None  # the exact torch its metadata pins (Requires-Dist: torch==X), if any
    registers_operators: bool = False  # calls torch::Library / c10::RegisterOperators (TORCH_LIBRARY...)
    symbols: int = 0  # undefined symbols judged (weak ones are not: they may stay unbound)
    providers: tuple[tuple[str, int], ...] = ()  # (library, symbols it provides), in load order
    unjudged: int = 0  # symbols found nowhere that the check cannot blame (the load order is incomplete)
    libraries_not_found: tuple[str, ...] = ()  # DT_NEEDED names found nowhere ("libfoo.so (needed by X; searched..)")
    layout_evidence: str | None = None  # why its own code has the other ABI than torch (verdict ABI_LAYOUT)
    pybind11_evidence: str | None = None  # its pybind11 internals against torch's, and the torch types it exchanges
    headers: str | None = None  # headers.SAME / headers.OTHER: the torch headers it was compiled against, if known
    header_sites: int = 0  # assertion sites of torch headers found in the binary
    header_differences: tuple[str, ...] = ()  # sites this torch's headers do not hold ("ATen/core/ivalue.h:1352")
    header_moved: tuple[str, ...] = ()  # the same assertion a few lines away ("ATen/core/ivalue.h:1315 (1317 here)")

    @property
    def other_headers(self) -> bool:
        """Resolves, registers operators, pins nothing, and was compiled against another torch's registration
        headers (see headers.REGISTRATION_HEADERS)."""
        return self.verdict in (VERSION_MISMATCH, UNCERTAIN) and not self.missing and self.requires_torch is None \
            and self.headers == OTHER

    @property
    def pinned_elsewhere(self) -> bool:
        """Every symbol binds, but its distribution pins another torch release than the one here."""
        return self.verdict in (VERSION_MISMATCH, PIN_MISMATCH, UNCERTAIN) and not self.missing \
            and self.requires_torch is not None

    def to_json(self) -> dict:
        return {"path": self.path, "abi": self.abi, "verdict": self.verdict, "torch_symbols": self.torch_symbols,
                "symbols": self.symbols, "providers": dict(self.providers), "unjudged": self.unjudged,
                "libraries_not_found": list(self.libraries_not_found), "layout_evidence": self.layout_evidence,
                "pybind11_evidence": self.pybind11_evidence,
                "headers": self.headers,
                "header_sites": self.header_sites, "header_differences": list(self.header_differences),
                "header_moved": list(self.header_moved),
                "missing": [symbol.to_json() for symbol in self.missing],
                "from_cuda_stub": [symbol.to_json() for symbol in self.from_cuda_stub],
                "distribution": self.distribution, "requires_torch": self.requires_torch,
                "registers_operators": self.registers_operators}


@dataclass(frozen=True)
class CheckReport:
    """Would `import torch_xla` (and every other torch extension here) load beside this torch?"""

    path: str
    verdict: str  # COMPATIBLE | PIN_MISMATCH | UNCERTAIN | a mismatch (words.py)
    summary: str
    torch_abi: str
    torch_libraries: tuple[str, ...]
    extensions: tuple[ExtensionCheck, ...]
    torch_version: str | None = None  # from torch-X.dist-info, when there is one
    system_libraries: bool = True  # the target's system libraries were read (False: an image read from outside)

    @property
    def compatible(self) -> bool:
        """The prediction is that everything loads (compatible or pin mismatch): exit 0."""
        return self.verdict in LOADS

    @property
    def needs_cuda_unavailable(self) -> bool:
        """Loads only where torch sees no GPU (some symbol comes from torch_xla's CUDA stub)."""
        return any(extension.from_cuda_stub for extension in self.extensions)

    def to_json(self) -> dict:
        return {"path": self.path, "verdict": self.verdict, "summary": self.summary, "torch_abi": self.torch_abi,
                "torch_version": self.torch_version, "needs_cuda_unavailable": self.needs_cuda_unavailable,
                "system_libraries": self.system_libraries, "torch_libraries": list(self.torch_libraries),
                "extensions": [extension.to_json() for extension in self.extensions]}


def extension_verdict(missing: Sequence[MissingSymbol], requires_torch: str | None,
                      torch_version: str | None) -> str:
    """From the symbols, then from the pin: another X.Y release is uncertain (measured: torchvision 0.23.0, pinned
    to torch 2.8.0, crashes beside 2.9.0; torchvision 0.22.0, pinned to 2.7.0, works beside 2.8.0), another patch
    release of this X.Y a pin mismatch (it loads)."""
    if any(item.problem == ABI_MISMATCH for item in missing):
        return ABI_MISMATCH
    if any(item.problem == PYTHON_MISMATCH for item in missing):
        return PYTHON_MISMATCH
    if missing:
        return VERSION_MISMATCH
    if requires_torch and torch_version and not same_release(requires_torch, torch_version):
        return PIN_MISMATCH if same_minor(requires_torch, torch_version) else UNCERTAIN
    return COMPATIBLE


# The verdicts of extensions that would not load or work, most severe first: a site's verdict is the first of
# these any of its extensions has, and its summary has a line for every broken extension, in its own words.
SEVERITY = (MISSING_LIBRARY, ABI_MISMATCH, ABI_LAYOUT, PYTHON_MISMATCH, PYBIND11_MISMATCH, VERSION_MISMATCH,
            UNCERTAIN)


def site_verdict(extensions: Sequence[ExtensionCheck], torch_abi: str,
                 torch_version: str | None = None) -> tuple[str, str]:
    """The site-packages' verdict and its one-paragraph summary."""
    if not extensions:
        return COMPATIBLE, "compatible: no extension module here links torch"
    broken = [extension for extension in extensions if extension.verdict not in LOADS]
    if not broken:
        return _loads(extensions, torch_abi, torch_version)
    this = f"torch {torch_version}" if torch_version else "this torch"
    kinds = [kind for kind in SEVERITY if any(extension.verdict == kind for extension in broken)]
    # A verdict this table does not know yet is judged as the least severe kind, never dropped from the summary.
    kinds += [VERSION_MISMATCH] if any(extension.verdict not in SEVERITY for extension in broken) else []
    lines: list[str] = []
    for kind in dict.fromkeys(kinds):
        group = [extension for extension in broken if extension.verdict == kind
                 or (kind == VERSION_MISMATCH and extension.verdict not in SEVERITY)]
        lines += (_version_lines(group, this) if kind == VERSION_MISMATCH else _uncertain_lines(group, this)
                  if kind == UNCERTAIN else [_broken_line(extension, torch_abi) for extension in group])
    return kinds[0], f"{kinds[0]}: " + "; ".join(lines)


def _broken_line(extension: ExtensionCheck, torch_abi: str) -> str:
    """Why one extension would not load or work, for every verdict but the version mismatch."""
    if extension.verdict == MISSING_LIBRARY:
        return f"{extension.path} cannot load: {some(list(extension.libraries_not_found), 2)}"
    if extension.verdict == ABI_MISMATCH:
        twins = sum(item.problem == ABI_MISMATCH for item in extension.missing)
        return (f"{extension.path} ({extension.abi} ABI) needs {twins} symbol(s) that torch ({torch_abi} ABI) "
                f"exports only with the other ABI's mangling")
    if extension.verdict == ABI_LAYOUT:
        return (f"{extension.path} resolves every symbol, but its own code was compiled with the other C++ ABI "
                f"({extension.layout_evidence}): std::string and what holds one differ in layout")
    if extension.verdict == PYTHON_MISMATCH:
        return (f"{extension.path} needs what this python does not offer: "
                f"{some([item.demangled for item in extension.missing if item.problem == PYTHON_MISMATCH], 2)}")
    return f"{extension.path} imports, but {extension.pybind11_evidence}: pybind11 cannot convert them"


def _version_lines(broken: Sequence[ExtensionCheck], this: str) -> list[str]:
    """The version mismatches: symbols (or symbol versions) no library of the load order defines."""
    return [_version_line(extension, this) for extension in broken]


def _uncertain_lines(group: Sequence[ExtensionCheck], this: str) -> list[str]:
    """Why the evidence does not decide, per heuristic: another release's headers, a pin on another torch, other
    pybind11 internals. Every symbol binds in all three."""
    lines = [f"{extension.path} resolves every symbol, registers torch operators and was compiled against another "
             f"torch release's headers (assertion sites of its {extension.header_sites} are not in {this}'s "
             f"boxing/IValue/schema headers: {some(list(extension.header_differences), 2)}); such builds abort "
             f"registering their operators or work, which the files do not tell apart"
             for extension in group if extension.other_headers]
    pinned: dict[tuple[str, str], list[str]] = {}
    for extension in group:
        if extension.pinned_elsewhere:
            pinned.setdefault((extension.distribution, extension.requires_torch), []).append(extension.path)
    lines.extend(f"{distribution} ({some(paths)}) requires torch=={requires}, this is {this}: its symbols resolve, "
                 f"but it was compiled against another torch release's headers (layouts, inline code, operator "
                 f"schemas), which symbols cannot check: it may crash registering its operators, or work"
                 for (distribution, requires), paths in pinned.items())
    lines.extend(f"{extension.path} imports, but {extension.pybind11_evidence}: pybind11 fails where a call converts "
                 f"one of them, and works where none is converted" for extension in group
                 if extension.pybind11_evidence and not (extension.other_headers or extension.pinned_elsewhere))
    return lines or [f"{extension.path}: the evidence does not decide" for extension in group]


def _loads(extensions: Sequence[ExtensionCheck], torch_abi: str, torch_version: str | None) -> tuple[str, str]:
    total = sum(extension.symbols for extension in extensions)
    torch_total = sum(extension.torch_symbols for extension in extensions)
    text = (f"{len(extensions)} extension(s) resolve all {total} symbols ({torch_total} from torch; torch uses the "
            f"{torch_abi} ABI)" + _cuda_stub_remark(extensions) + _operators_remark(extensions, torch_version))
    unjudged = sum(extension.unjudged for extension in extensions)
    if unjudged:
        text += (f"; {unjudged} symbol(s) were found nowhere but cannot be judged: libraries they may come from "
                 f"were not found or not read")
    pins = [extension for extension in extensions if extension.verdict == PIN_MISMATCH]
    if not pins:
        return COMPATIBLE, "compatible: " + text
    this = f"torch {torch_version}" if torch_version else "this torch"
    owners = sorted({f"{extension.distribution} requires torch=={extension.requires_torch}" for extension in pins})
    return PIN_MISMATCH, (f"pin mismatch: {text}; but {'; '.join(owners)}, this is {this} (the same release "
                          f"series): it loads, and pip would refuse this set")


def _version_line(extension: ExtensionCheck, this: str) -> str:
    pinned = f" ({extension.distribution} requires torch=={extension.requires_torch})" \
        if extension.requires_torch else ""
    torchs = any(is_torch_entity(item.symbol) for item in extension.missing)
    where = f"{this} does not export under either ABI" if torchs else "no library of its load order exports"
    return (f"{extension.path}{pinned} needs {len(extension.missing)} symbol(s) {where} - it was built against "
            f"another torch version ({some([item.demangled for item in extension.missing], 2)})")


def built_with(extension: ExtensionCheck, torch_version: str | None) -> bool:
    """Built together with this torch release: pinned to it, or torch_xla X.Y beside torch X.Y (torch_xla pins no
    torch in its metadata; upstream builds each torch_xla release against the torch release of the same number)."""
    if not torch_version or not extension.distribution:
        return False
    if extension.requires_torch:
        return same_minor(extension.requires_torch, torch_version)
    name, _, version = extension.distribution.partition(" ")
    return name.lower().replace("-", "_") == "torch_xla" and version.split(".")[:2] == torch_version.split(".")[:2]


def _operators_remark(extensions: Sequence[ExtensionCheck], torch_version: str | None) -> str:
    """Symbols resolving does not prove operator registration works: say so for extensions not pinned to this
    torch release by their metadata."""
    unchecked = [extension.path for extension in extensions
                 if extension.registers_operators and not built_with(extension, torch_version)
                 and extension.headers is None]
    nearly = [f"{extension.path} ({some(list(extension.header_differences), 2)})" for extension in extensions
              if extension.registers_operators and extension.headers == OTHER and extension.verdict in LOADS]
    text = ""
    if unchecked:
        text += (f"; symbols resolve, runtime operator compatibility not checkable: {some(unchecked)} register "
                 f"torch operators and pin no torch release in their metadata")
    if nearly:
        text += (f"; {some(nearly)} register operators and were compiled against other torch headers, which differ "
                 f"from this torch's outside those that shape operator registration")
    return text


def _cuda_stub_remark(extensions: Sequence[ExtensionCheck]) -> str:
    stubbed = [item.demangled for extension in extensions for item in extension.from_cuda_stub]
    if not stubbed:
        return ""
    verb = "is" if len(stubbed) == 1 else "are"
    return (f"; only while CUDA is unavailable: {len(stubbed)} of them ({some(stubbed)}) {verb} not in this torch "
            f"and bind to torch_xla's {CUDA_STUB_PREFIX}, which torch_xla loads only when torch.cuda.is_available() is "
            f"False - where torch sees a GPU, `import torch_xla` fails (pytorch/xla#9656)")
