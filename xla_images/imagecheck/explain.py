"""Why a module did not import: the loader's own words, then the static reader's (xla_images.abi).

The verdict is loading's; this only adds the evidence. The loader names one undefined symbol and the library
that wanted it; abi says which ABI that symbol is, what it is readable, and — by reading the extensions of the
failing distribution — whether torch exports its twin under the other ABI, which libraries are missing, which
torch it pins. Nothing here can turn a loading import into a failure.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .. import abi
from ..errors import XlaImagesError
from .loading import CRASHED, EXITED, TIMED_OUT, Outcome

_UNDEFINED = re.compile(r"(?P<library>/\S+?): undefined symbol: (?P<symbol>\S+)")
_NOT_FOUND = re.compile(r"(?P<needed>\S+\.so[.0-9]*): cannot open shared object file")


def symbol_words(symbol: str) -> str:
    """`_ZN…B5cxx11… (C++11 ABI; c10::…)`: the ABI a mangled name shows, and its readable form."""
    new, old = abi.symbol_abi(symbol)
    which = "C++11 ABI" if new and not old else "pre-C++11 ABI" if old and not new else ""
    readable = abi.demangle([symbol]).get(symbol, symbol)
    parts = [part for part in (which, readable if readable != symbol else "") if part]
    return f"{symbol} ({'; '.join(parts)})" if parts else symbol


def from_message(outcome: Outcome) -> str:
    """The loader's evidence in the error text: an undefined symbol and who wanted it, a library not found."""
    undefined = _UNDEFINED.search(outcome.message)
    if undefined:
        return (f"undefined symbol {symbol_words(undefined.group('symbol'))} wanted by "
                f"{undefined.group('library')}, which nothing loaded before it exports")
    missing = _NOT_FOUND.search(outcome.message)
    if missing:
        return f"the loader found no {missing.group('needed')}"
    if outcome.status == CRASHED:
        return f"the import killed python with {outcome.error}: its native code crashed while loading"
    if outcome.status == TIMED_OUT:
        return "the import did not finish in the time limit"
    if outcome.status == EXITED:
        return f"the import ended python ({outcome.error})"
    return ""


def static_evidence(site: Path, modules: list[str], image_tree: Path) -> list[str]:
    """What abi's reading of the failing modules' extensions adds (empty when it finds nothing or cannot run)."""
    try:
        report = abi.check_site_packages(site, also_inside=(image_tree,) if image_tree.is_dir() else ())
    except (XlaImagesError, OSError, ValueError):
        return []  # the explanation is extra: its absence changes no verdict
    words = []
    roots = tuple(os.path.join(str(site), module) for module in modules)
    for extension in report.extensions:
        path = extension.path if os.path.isabs(extension.path) else os.path.join(str(site), extension.path)
        if extension.verdict in abi.LOADS or not path.startswith(roots):
            continue
        words.append(f"{extension.path}: {_cause(extension, report.torch_abi)}")
    return words


def _cause(extension: abi.ExtensionCheck, torch_abi: str | None) -> str:
    if extension.verdict == abi.ABI_MISMATCH:
        cause = f"built for the other ABI ({extension.abi}, torch is {torch_abi})"
    else:
        evidence = (", ".join(extension.libraries_not_found[:2]) or extension.layout_evidence
                    or extension.pybind11_evidence)
        cause = f"{extension.verdict} ({evidence})" if evidence else extension.verdict
    if extension.missing:
        first = extension.missing[0]
        more = f" and {len(extension.missing) - 1} more" if len(extension.missing) > 1 else ""
        twin = f"; torch exports {first.twin}" if first.twin else ""
        cause += f"; missing symbol {first.symbol}{more}{twin}"
    if extension.requires_torch:
        cause += f"; its metadata pins torch {extension.requires_torch}"
    return cause
