"""The words of the ABI tooling: ABI names, verdicts, the rules its errors name, and where images keep python.

The ABI names ("cxx11", "pre-cxx11") are the values of `xla_images.model.flavour.Abi` and SITE_PACKAGES_GLOBS
starts with `names.VENV`: this package runs standalone (the standard library + xla_images.errors), so it keeps its
own copies; tests/unit/test_architecture.py holds them equal.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError

CXX11 = "cxx11"
PRE_CXX11 = "pre-cxx11"
NO_STRINGS = "none"
MIXED = "mixed"

# Verdicts of `check`, for one extension and for a site-packages. A load prediction: COMPATIBLE and PIN_MISMATCH
# load (exit 0), ABI_MISMATCH and VERSION_MISMATCH do not or crash (exit 1), UNCERTAIN is not decided (exit 3).
COMPATIBLE = "compatible"
ABI_MISMATCH = "abi mismatch"
VERSION_MISMATCH = "version mismatch"
# Every symbol resolves and the extension was built for this torch release (X.Y), but its metadata pins another
# patch release (torchvision 0.22.1 pins torch==2.7.1, beside 2.7.0): it loads and runs; pip would refuse it.
PIN_MISMATCH = "pin mismatch"
# A DT_NEEDED name ld.so finds nowhere (its search order: loader.Loader): "cannot open shared object file".
MISSING_LIBRARY = "missing library"
# Every symbol resolves, but the extension's own code was compiled with the other _GLIBCXX_USE_CXX11_ABI than torch:
# std::string and the structs holding one have another layout on each side (the first call crashes).
ABI_LAYOUT = "abi mismatch (layout)"
# A pybind11 module built with other pybind11 internals than torch's that exchanges a type torch binds: it imports,
# then the call fails ("Unable to convert function return value to a Python type").
PYBIND11_MISMATCH = "pybind11 mismatch"
# The python that imports lacks a C API symbol the extension needs (PyType_GetFullyQualifiedName, new in 3.13, on
# 3.11: "undefined symbol"), or the extension's file is tagged for another python (cpython-313 on 3.11).
PYTHON_MISMATCH = "python mismatch"
# The evidence does not decide: every symbol binds (nothing the loader will refuse), but a heuristic says the
# extension may not work beside this torch - its metadata pins another torch X.Y, it was compiled against another
# torch's registration headers, or its pybind11 internals differ from torch's. Measured on real wheels
# (benchmarks/abi_corpus) each of these is sometimes right and sometimes wrong, so none is called a mismatch.
UNCERTAIN = "uncertain"
LOADS = frozenset({COMPATIBLE, PIN_MISMATCH})
# Exit codes of `abi check`: 0 loads, 1 a definite mismatch, 2 bad input, 3 uncertain.
EXIT_UNCERTAIN = 3

# What a missing symbol is (MissingSymbol.problem), besides ABI_MISMATCH and VERSION_MISMATCH.
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

# Rules named by the usage errors.
RULE_INPUT = "abi-input"
RULE_ELF = "abi-elf-readable"
RULE_WHEEL = "abi-wheel-readable"
RULE_PATH = "abi-path-readable"
RULE_IMAGE = "abi-image-reference"


def usage_error(message: str, hint: str | None = None, rule: str = RULE_INPUT) -> ConfigError:
    """The one error type of the project (exit 2), with the rule the ABI tooling names."""
    return ConfigError(message, rule=rule, hint=hint)


def some(names: Sequence[str], shown: int = 3) -> str:
    """The first few names, and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def reason(error: BaseException) -> str:
    """An exception as one short line for a message."""
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    return text if len(text) <= 200 else text[:200] + "..."
