"""Plain-text reports of `inspect` and `check` for the standalone command line (build.py prints its own tables)."""
from __future__ import annotations

from .inspection import INTERFACE_BASIS, PackageReport
from .verdict import CheckReport
from .words import CUDA_STUB_PREFIX


def format_package(report: PackageReport) -> str:
    lines = [f"{report.path} [{report.kind}] abi={report.abi} platform={report.platform_tag or '-'}",
             f"  verdict: {report.verdict}"]
    for item in report.shared_objects:
        notes = ["bundled toolchain runtime"] if item.bundled_runtime else []
        if item.abi_basis != INTERFACE_BASIS:
            notes.append(f"from {item.abi_basis}")
        bundled = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {item.abi:<9} glibc={item.glibc or '-':<5} glibcxx={item.glibcxx or '-':<7} "
                     f"cxx11={item.cxx11_symbols:<6} pre={item.pre_cxx11_symbols:<6} {item.path}{bundled}")
    return "\n".join(lines)


def format_check(report: CheckReport, limit: int = 20) -> str:
    version = f" (torch {report.torch_version})" if report.torch_version else ""
    lines = [f"{report.path}: torch libraries{version} use the {report.torch_abi} ABI"]
    for extension in report.extensions:
        owner = f", {extension.distribution}" if extension.distribution else ""
        owner += f" requires torch=={extension.requires_torch}" if extension.requires_torch else ""
        lines.append(f"  {extension.verdict:<16} {extension.path} (abi {extension.abi}, "
                     f"{extension.symbols} symbols, {extension.torch_symbols} from torch{owner})")
        for item in extension.missing[:limit]:
            lines.append(f"    missing [{item.problem}] {item.demangled}")
            if item.twin_demangled:
                lines.append(f"      torch exports instead: {item.twin_demangled}")
        if len(extension.missing) > limit:
            lines.append(f"    ... and {len(extension.missing) - limit} more (--json lists all)")
        for item in extension.from_cuda_stub[:limit]:
            lines.append(f"    from {CUDA_STUB_PREFIX} (no GPU only) {item.demangled}")
        if extension.headers:
            lines.append(f"    compiled against {extension.headers} ({extension.header_sites} assertion sites"
                         + (f"; not in this torch: {', '.join(extension.header_differences)}"
                            if extension.header_differences else "")
                         + (f"; moved a few lines: {', '.join(extension.header_moved)}" if extension.header_moved
                            else "") + ")")
        for name in extension.libraries_not_found[:limit]:
            lines.append(f"    library not found: {name}")
    lines.append(report.summary)
    return "\n".join(lines)
