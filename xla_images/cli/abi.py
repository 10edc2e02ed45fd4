"""`abi inspect` and `abi check`: which C++ ABI do binaries use, and will torch_xla load beside this torch?"""
from __future__ import annotations

import json
from typing import Sequence

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import abi as abi_tools
from ..errors import Failure
from ..run.checking import abi_images

MISSING_SHOWN = 20


class Uncertain(Failure):
    """`abi check` could not decide: every symbol binds, a heuristic doubts that it works. Exit code 3, apart from
    the definite mismatches (1), so scripts can tell "will fail" from "try it"."""

    exit_code = abi_tools.EXIT_UNCERTAIN


@click.group("abi")
def abi() -> None:
    """Read the C++ ABI (cxx11 / pre-cxx11) of wheels, site-packages and images.

    \b
    Mismatched ABIs fail at import as `undefined symbol: _ZN5torch4lazy13MetricFnValueB5cxx11E...`;
    `abi check` predicts that failure from the symbol tables, without importing anything.
    """


@abi.command("inspect")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: an object for a path, an array (one per site-packages) for an image.")
def inspect_command(target: str, as_json: bool) -> None:
    """ABI, GLIBC and GLIBCXX needs of each shared object in TARGET, and a verdict per package.

    \b
    TARGET is a wheel (.whl), a directory (site-packages) or, if no such path exists, an image.
    Examples:
      build.py abi inspect wheelhouse/torch_xla-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl
      build.py abi inspect xla:r2.9.0_3.11_tpuvm --json | jq '.[].abi'
    """
    reports = abi_images.inspect_target(target)
    if as_json:
        _print_json(reports, single=abi_tools.is_path_target(target))
        return
    console = Console(width=160)
    for report in reports:
        _print_package(console, report)


@abi.command("check")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: an object for a path, an array (one per site-packages) for an image.")
def check_command(target: str, as_json: bool) -> None:
    """Would torch_xla's _XLAC and every other extension linking torch load beside this torch?

    \b
    Binds every undefined symbol of each extension in the order the dynamic loader would (its DT_NEEDED
    closure with RUNPATH/RPATH/$ORIGIN, torch's libraries, the system's) and weighs torch pins. Verdicts:
      compatible        everything resolves (exit 0)
      pin mismatch      everything resolves and it was built for this torch X.Y, but its metadata pins
                        another patch release: it loads; pip would refuse the set (exit 0)
      abi mismatch      symbols exist only with the other ABI's mangling (exit 1)
      version mismatch  symbols exist in no library of the load order under either ABI (exit 1)
      missing library, python mismatch, abi mismatch (layout): see docs/abi.md (exit 1)
      uncertain         every symbol binds, but its metadata pins another torch X.Y, or it registers operators
                        compiled against other torch headers, or its pybind11 internals differ from torch's:
                        measured, such mixes crash or work; try the import (exit 3)
    Symbols resolving does not prove that operator registrations match: the verdict says so for extensions
    that register torch operators without pinning this torch. For an image the image's system libraries
    are not read (the image checks run the tool inside the image).
    TARGET is a site-packages directory (or a venv) or, if no such path exists, an image.
    Bad paths and targets without torch exit 2.
    """
    reports = abi_images.check_target(target)
    if as_json:
        _print_json(reports, single=abi_tools.is_path_target(target))
    else:
        console = Console(width=160)
        for report in reports:
            _print_check(console, report)
    broken = [report for report in reports if not report.compatible]
    if broken and all(report.verdict == abi_tools.UNCERTAIN for report in broken):
        raise Uncertain("; ".join(report.summary for report in broken), rule="abi-uncertain",
                        hint="import the extension and call into it beside this torch (a fresh python), or install "
                             "the release built for this torch")
    if broken:
        raise Failure("; ".join(report.summary for report in broken), rule="abi-compatible",
                      hint="install the torch_xla / torchvision / torchaudio release built for this torch and its "
                           "ABI (the flavour's `abi`; the release an extension's metadata pins), or rebuild the "
                           "extension against this torch with -D_GLIBCXX_USE_CXX11_ABI matching torch._C."
                           "_GLIBCXX_USE_CXX11_ABI")


def _print_json(reports: Sequence, *, single: bool) -> None:
    document = reports[0].to_json() if single else [report.to_json() for report in reports]
    click.echo(json.dumps(document, indent=2))


def _print_package(console: Console, report: abi_tools.PackageReport) -> None:
    table = Table("abi", "glibc", "glibcxx", "cxx11 syms", "pre-cxx11 syms", "shared object",
                  title=escape(f"{report.path} ({report.kind}, platform {report.platform_tag or '-'})"))
    for item in report.shared_objects:
        notes = []
        if item.bundled_runtime:
            notes.append("bundled toolchain runtime")
        if item.abi_basis != abi_tools.INTERFACE_BASIS:
            notes.append(f"from {item.abi_basis}")
        name = item.path + (f" ({'; '.join(notes)})" if notes else "")
        table.add_row(item.abi, item.glibc or "-", item.glibcxx or "-", str(item.cxx11_symbols),
                      str(item.pre_cxx11_symbols), escape(name))
    console.print(table)
    console.print(f"[bold]{report.abi}[/bold]: {escape(report.verdict)}", highlight=False)


def _print_check(console: Console, report: abi_tools.CheckReport) -> None:
    torch = f"torch {report.torch_version}, " if report.torch_version else "torch: "
    table = Table("verdict", "abi", "symbols", "from torch", "missing", "extension", "distribution (pins)",
                  title=escape(f"{report.path} ({torch}{report.torch_abi} ABI)"))
    for extension in report.extensions:
        owner = extension.distribution or "-"
        if extension.requires_torch:
            owner += f" (torch=={extension.requires_torch})"
        table.add_row(extension.verdict, extension.abi, str(extension.symbols), str(extension.torch_symbols),
                      str(len(extension.missing)), escape(extension.path), escape(owner))
    console.print(table)
    for extension in report.extensions:
        # Symbols bound to torch_xla's CUDA stub are not in torch either: shown with the missing ones, marked so.
        not_in_torch = (*extension.missing, *extension.from_cuda_stub)
        if not not_in_torch:
            continue
        missing = Table("problem", "missing symbol", "exported instead",
                        title=escape(f"bound by nothing in the load order, needed by {extension.path}"))
        for item in not_in_torch[:MISSING_SHOWN]:
            missing.add_row(item.problem, escape(item.demangled), escape(item.twin_demangled or "-"))
        console.print(missing)
        if len(not_in_torch) > MISSING_SHOWN:
            console.print(f"... and {len(not_in_torch) - MISSING_SHOWN} more (--json lists all)")
    cautious = report.needs_cuda_unavailable or report.verdict == abi_tools.PIN_MISMATCH
    style = ("yellow" if cautious else "green") if report.compatible else \
        "yellow" if report.verdict == abi_tools.UNCERTAIN else "red"
    console.print(f"[{style}]{escape(report.summary)}[/{style}]", highlight=False)
