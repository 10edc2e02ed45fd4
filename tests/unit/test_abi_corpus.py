"""`abi check` against recorded reality (issue 42): samples of benchmarks/abi_corpus/truth.json.

Each fixture in tests/fixtures/abi/corpus/ is one measured mix (a real wheel beside a real torch, imported and
called in a fresh python: its outcome and message) reduced to what `check` reads of the extension that decides it:
its DT_NEEDED torch libraries, its undefined symbols that torch defines (in which library) or that nothing defines
(with the twin torch exports under the other ABI), and its distribution's torch pin
(`benchmarks/bench_abi_corpus.py extract` writes them). The test rebuilds tiny ELF files with exactly those
symbols and names, checks the tiny site, and asserts that the verdict is the one recorded from the real wheels and
that no verdict is a definite mismatch where the mix works: a rule change that brings a false alarm back fails
here, without the ~1 GB of wheels.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xla_images import abi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abi" / "corpus"
SAMPLES = sorted(FIXTURES.glob("*.json"))
DEFINITE = (abi.MISSING_LIBRARY, abi.ABI_MISMATCH, abi.ABI_LAYOUT, abi.PYTHON_MISMATCH, abi.VERSION_MISMATCH,
            abi.PYBIND11_MISMATCH)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the tiny ELF files")


def _compile(source: str, output: Path, *flags: str) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    unit = output.with_name(output.name + ".c")
    unit.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", str(unit), "-o", str(output), *flags], check=True, timeout=120,
                   capture_output=True)
    unit.unlink()


def _label(name: str) -> str:
    assert re.fullmatch(r"[A-Za-z0-9_.$]+", name), name  # mangled names only: nothing to escape in an asm label
    return name


def _defining(symbols: list[str], strings: list[str] = ()) -> str:
    lines = [f'void d{index}(void) __asm__("{_label(name)}");\nvoid d{index}(void) {{}}'
             for index, name in enumerate(symbols)]
    return "\n".join(lines) + _strings(strings) + "\nint xla_images_tiny_library;\n"


def _strings(strings: list[str]) -> str:
    """Strings kept in .rodata, each after a NUL (as the compiler lays out string literals): what headers.py reads
    (assertion sites, pybind11's internals id). Octal escapes: any byte, and never more than three digits."""
    return "".join("\n__attribute__((used)) static const char s%d[] = \"%s\";" % (
        index, "".join(f"\\{byte:03o}" for byte in text.encode("latin-1"))) for index, text in enumerate(strings))


def _referencing(undefined: list[list], defines: list[str], strings: list[str]) -> str:
    """References that stay undefined in the object: one function declaration per symbol (weak where the real one
    is weak), their addresses kept in an exported table; the torch typeinfo it defines; its strings."""
    lines = [f'extern void u{index}(void){" __attribute__((weak))" if weak else ""} __asm__("{_label(name)}");'
             for index, (name, weak) in enumerate(undefined)]
    table = ", ".join(f"(void *)&u{index}" for index in range(len(undefined)))
    own = "".join(f'\nvoid e{index}(void) __asm__("{_label(name)}");\nvoid e{index}(void) {{}}'
                  for index, name in enumerate(defines))
    return "\n".join(lines) + f"\nvoid *xla_images_references[] = {{{table}}};\n" + own + _strings(strings) + "\n"


def _include(site: Path, headers: dict) -> None:
    """torch/include with the lines of each header the rule reads (around the sites), blank elsewhere."""
    for header, entry in headers.items():
        lines = [""] * entry["count"]
        for number, text in entry["lines"].items():
            lines[int(number) - 1] = text
        path = site / "torch" / "include" / header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")


def _dist_info(site: Path, name: str, version: str, requires: str | None, files: list[str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: torch=={requires}"] if requires else []
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("".join(f"{path},sha256=x,1\n" for path in files) + f"{info.name}/RECORD,,\n")


def tiny_site(sample: dict, root: Path) -> Path:
    """The sample as a site-packages of tiny ELF files: torch/lib with the symbols the extension takes from each
    library, the extension needing those libraries and referencing its symbols, both dist-infos."""
    site = root / "site-packages"
    library = site / "torch" / "lib"
    pybind11 = sample.get("pybind11") or {}
    libraries = dict(sample["torch_defines"])
    if pybind11.get("torch"):
        libraries.setdefault("libtorch_python.so", [])
    # twice: then each library can link the torch libraries it needs (libtorch_cpu.so -> libgomp-*.so.1: the
    # extension binds OpenMP through that closure, torch._C being loaded RTLD_LOCAL)
    for needs in ({}, sample.get("torch_needed", {})):
        for name, symbols in libraries.items():
            strings = [pybind11["torch"]] if name == "libtorch_python.so" and pybind11.get("torch") else []
            links = [f"-l:{item}" for item in needs.get(name, [])]
            if links or not needs:
                _compile(_defining(symbols, strings), library / name, f"-Wl,-soname,{name}", f"-L{library}",
                         "-Wl,--no-as-needed", *links)
    _dist_info(site, "torch", sample["torch_version"], None, [])
    _include(site, sample.get("include", {}))
    links = [f"-l:{name}" for name in sample["needed"]]
    strings = [*sample.get("strings", []), *([pybind11["extension"]] if pybind11.get("extension") else [])]
    _compile(_referencing(sample["undefined"], sample.get("defines", []), strings), site / sample["extension"],
             f"-L{library}", "-Wl,--no-as-needed", *links)
    if sample["distribution"]:
        name, _, version = sample["distribution"].partition(" ")
        _dist_info(site, name, version, sample["requires_torch"], [sample["extension"]])
    return site


def test_the_recorded_samples_are_there() -> None:
    """The sample covers a mix that works, a definite mismatch and an uncertain verdict at least."""
    samples = [json.loads(path.read_text()) for path in SAMPLES]
    verdicts = {sample["verdict"] for sample in samples}
    assert len(samples) >= 4 and abi.UNCERTAIN in verdicts and verdicts & set(DEFINITE), verdicts
    assert any(sample["truth"]["outcome"] == "works" for sample in samples)


@pytest.mark.parametrize("path", SAMPLES, ids=[path.stem for path in SAMPLES])
def test_check_agrees_with_the_recorded_reality(path: Path, tmp_path: Path) -> None:
    sample = json.loads(path.read_text())
    truth = sample["truth"]
    report = abi.check_site_packages(tiny_site(sample, tmp_path))
    (extension,) = [item for item in report.extensions if item.path == sample["extension"]]
    # the verdict `check` gives the real wheels (recorded by `extract`) is the tiny site's too
    assert extension.verdict == sample["verdict"], (extension.verdict, report.summary)
    if truth["outcome"] == "works":  # never a false alarm: a mismatch verdict must never be wrong
        assert extension.verdict not in DEFINITE, (truth, report.summary)
    if extension.verdict in DEFINITE:
        assert truth["outcome"] != "works"
        named = re.search(r"undefined symbol: (\S+)", truth["message"])
        if named:  # the loader's first failing symbol is one `check` names
            assert named.group(1).rstrip(",") in {item.symbol for item in extension.missing}, extension.missing
