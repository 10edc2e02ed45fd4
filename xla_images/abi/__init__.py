"""Read the libstdc++ dual ABI of torch / torch_xla binaries and predict whether extensions load beside a torch.

Users meet ABI trouble as `ImportError: ... undefined symbol: _ZN5torch4lazy13MetricFnValueB5cxx11E...` when
torch_xla, a custom extension or a plugin was compiled with the other `_GLIBCXX_USE_CXX11_ABI` than the torch
beside it, or against another torch release. Two questions answer it from the ELF files alone (nothing is imported
or run):

* ``inspect`` (`inspection`): which ABI does each shared object of a wheel, a directory or an image use, and which
  GLIBC / GLIBCXX versions does it need?
* ``check`` (`check`, `loader`, `verdict`): would every extension linking torch load? Each undefined symbol is
  bound in the order glibc's loader would bind it (`loader`), and the metadata's torch pins are weighed.

The modules, each with one job: `words` (names, verdicts, rules, the one error helper), `elf` (bounded reading of
the dynamic tables), `mangling` (ABI markers of mangled names, twins, demangling), `files` (walking trees),
`wheel` (reading wheels), `inspection`, `metadata` (dist-info), `loader`, `check`, `verdict`, `report` (plain
text), `cli` (the standalone command line), `standalone` (the one-file zipapp). Images are read by
`xla_images.run.checking.abi_images`, which needs the engine.

``--json`` prints `PackageReport.to_json` for inspect and `CheckReport.to_json` for check (an array, one per
site-packages, for an image).

STANDALONE USE. The package imports only the standard library and `xla_images.errors` (the project's one error
type), so it runs where xla_images is not installed: `python -m xla_images.abi` with the repository on the path,
`python REPO/xla_images/abi`, or the zipapp `standalone.write_zipapp` makes. Exit codes: 0 fine, 1 ABI/version
mismatch or missing library, 2 usage error, 3 uncertain (every symbol binds; a heuristic doubts it works).
"""
from .check import check_path_target, check_site_packages, find_torch_site, has_torch_libraries, host_system
from .elf import CorruptElf, ElfDynamic, UndefinedSymbol, read_elf_dynamic, read_elf_file
from .files import is_path_target, missing_path_error, walk_shared_objects
from .inspection import (INTERFACE_BASIS, STD_DEFINITIONS_BASIS, STD_REFERENCES_BASIS, PackageReport,
                         SharedObjectReport, classify_dynamic, classify_shared_object, inspect_directory,
                         inspect_path, inspect_path_target, package_abi)
from .loader import SystemLibraries, library_path_of
from .mangling import abi_neutral_key, count_abi_symbols, demangle, is_torch_entity, names_torch_namespace, \
    symbol_abi
from .verdict import CheckReport, ExtensionCheck, MissingSymbol, site_verdict
from .words import (ABI_LAYOUT, ABI_MISMATCH, COMPATIBLE, CUDA_STUB_PREFIX, CXX11, FROM_CUDA_STUB, LOADS,
                    MISSING_LIBRARY, MIXED, NO_STRINGS, PIN_MISMATCH, PRE_CXX11, PYBIND11_MISMATCH, PYTHON_MISMATCH,
                    RULE_ELF, RULE_IMAGE, RULE_PATH, RULE_WHEEL, SITE_PACKAGES_GLOBS, UNCERTAIN, VERSION_MISMATCH,
                    EXIT_UNCERTAIN)

__all__ = [
    "ABI_LAYOUT", "ABI_MISMATCH", "COMPATIBLE", "CUDA_STUB_PREFIX", "CXX11", "EXIT_UNCERTAIN", "FROM_CUDA_STUB",
    "INTERFACE_BASIS", "UNCERTAIN",
    "LOADS",
    "MISSING_LIBRARY", "MIXED", "PYBIND11_MISMATCH", "PYTHON_MISMATCH",
    "NO_STRINGS", "PIN_MISMATCH", "PRE_CXX11", "RULE_ELF", "RULE_IMAGE", "RULE_PATH", "RULE_WHEEL",
    "SITE_PACKAGES_GLOBS", "STD_DEFINITIONS_BASIS", "STD_REFERENCES_BASIS", "VERSION_MISMATCH", "CheckReport",
    "CorruptElf", "ElfDynamic", "ExtensionCheck", "MissingSymbol", "PackageReport", "SharedObjectReport",
    "SystemLibraries", "UndefinedSymbol", "abi_neutral_key", "check_path_target", "check_site_packages",
    "classify_dynamic", "classify_shared_object", "count_abi_symbols", "demangle", "find_torch_site",
    "has_torch_libraries", "host_system", "inspect_directory", "inspect_path", "inspect_path_target",
    "is_path_target", "is_torch_entity", "library_path_of", "missing_path_error", "names_torch_namespace",
    "package_abi",
    "read_elf_dynamic", "read_elf_file", "site_verdict", "symbol_abi", "walk_shared_objects",
]
