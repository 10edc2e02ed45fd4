#!/usr/bin/env python3
"""Measure `abi check` against reality on a corpus of real extension wheels (issue 42).

    python benchmarks/bench_abi_corpus.py measure [--releases 2.8.0 ...] [--packages torchvision ...]
    python benchmarks/bench_abi_corpus.py judge   [--releases ...] [--packages ...] [--truth FILE]

`measure` rebuilds the ground truth: for each torch release of benchmarks/abi_corpus/corpus.json and each version
of each package there, a site-packages is assembled (the torch release, its CUDA libraries, the package version
installed with `pip install --no-deps --target`) and a fresh python imports the package and calls into its C++
code (the corpus' probe) with a timeout. The outcome is `works`, `import-fails`, `call-fails`, `crashes` (killed
by a signal) or `timeout`. The example extension (xla_images/extension_example) is built against each torch with
`pip wheel --no-build-isolation` and the host's g++. Rows go to --out (JSON lines) as they are measured, with the
verdict of the `abi check` of the code running this script; `--write-truth` turns them into truth.json.

`judge` re-runs only `abi check` (the current rules) on each row of truth.json and prints the confusion table per
release pair: agree, false alarm (a definite mismatch where the mix works), miss (compatible where it breaks),
uncertain (works / breaks).

The torch site is the host venv's (torch 2.9.0 and its nvidia-* CUDA 12 libraries, read only); other releases
replace torch, as benchmarks/abi_mixes.py does, from wheels cached in $XLA_IMAGES_TEST_WHEELS (default
~/.cache/xla-images/test-wheels; ~3.5 GB of wheels, ~8 GB with the installed overlays). torch 2.6-2.8 run on
2.9's CUDA 12.8 libraries (CUDA 12 minor versions are compatible; nothing here touches a GPU).
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import abi_mixes  # noqa: E402
from xla_images import abi  # noqa: E402

CORPUS = ROOT / "benchmarks" / "abi_corpus" / "corpus.json"
TRUTH = ROOT / "benchmarks" / "abi_corpus" / "truth.json"
RUN_TIMEOUT = 300
BUILD_TIMEOUT = 1800
UNCERTAIN = getattr(abi, "UNCERTAIN", "uncertain")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
# The per-mix verdict is the most severe of its judged extensions'.
ORDER = (abi.MISSING_LIBRARY, abi.ABI_MISMATCH, abi.PYTHON_MISMATCH, abi.VERSION_MISMATCH, abi.ABI_LAYOUT,
         abi.PYBIND11_MISMATCH, UNCERTAIN, abi.PIN_MISMATCH, abi.COMPATIBLE)


def load_corpus() -> dict:
    return json.loads(CORPUS.read_text())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def torch_entries(release: str, corpus: dict) -> list[Path]:
    """What the view takes of a torch release: torch, functorch, torchgen and its dist-info; the host's nvidia
    libraries; the release's companions (corpus.json)."""
    host = abi_mixes.host_site()
    if corpus["releases"][release].get("host"):
        sources = [host]
    else:
        sources = [abi_mixes.overlay(f"torch=={release}")]
    keep = ("torch", "functorch", "torchgen", "triton", "nvidia")
    entries = [entry for source in sources for entry in source.iterdir()
               if entry.name.split("-")[0].lower().startswith(keep) and entry.name != ".installed"]
    entries += [entry for item in corpus["releases"][release]["companions"]  # all of them (cusparselt/lib)
                for entry in abi_mixes.overlay(item).iterdir() if entry.name not in ("bin", ".installed")]
    overlaid = {entry.name.split("-")[0] for entry in entries}
    entries += [entry for entry in host.iterdir() if entry.name.startswith("nvidia")
                and entry.name.split("-")[0] not in overlaid]
    return entries


def site_view(directory: Path, entries: list[Path]) -> Path:
    directory.mkdir(parents=True)
    for entry in entries:
        if not (directory / entry.name).exists():
            abi_mixes.mirror(entry, directory / entry.name)
    return directory


def build_example(release: str, corpus: dict, scratch: Path) -> Path:
    """The example extension built against torch `release` (pip wheel --no-build-isolation, the host's g++),
    cached as WHEELS/built/<release>/xla_ext_example-*.whl."""
    out = abi_mixes.WHEELS / "built" / release
    found = sorted(out.glob("xla_ext_example-*.whl"))
    if found:
        return found[0]
    tools = abi_mixes.WHEELS / "overlays" / "buildtools"
    if not (tools / ".installed").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tools),
                        "wheel==0.45.1", "setuptools==75.8.0"], check=True, timeout=600)
        (tools / ".installed").touch()
    view = site_view(scratch / "build-site", torch_entries(release, corpus))
    source = scratch / "example"
    shutil.copytree(ROOT / corpus["packages"]["xla-ext-example"]["build"], source)
    env = {**os.environ, "PYTHONPATH": f"{view}:{tools}", "MAX_JOBS": "1", "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                                str(out), str(source)], capture_output=True, text=True, env=env,
                               timeout=BUILD_TIMEOUT)
    found = sorted(out.glob("xla_ext_example-*.whl"))
    if completed.returncode != 0 or not found:
        raise RuntimeError(f"cannot build the example against torch {release}: {completed.stderr[-800:]}")
    shutil.rmtree(view)
    return found[0]


def package_overlay(package: str, version: str, corpus: dict, scratch: Path) -> tuple[Path, Path]:
    """(installed directory, wheel) of one package version."""
    if "build" in corpus["packages"][package]:
        wheel = build_example(version, corpus, scratch)
        target = abi_mixes.WHEELS / "overlays" / f"{package}-built-{version}"
        if not (target / ".installed").exists():
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                            "--target", str(target), str(wheel)], check=True, timeout=600)
            (target / ".installed").touch()
        return target, wheel
    return abi_mixes.overlay(f"{package}=={version}"), abi_mixes.fetch_wheel(f"{package}=={version}")


def mix_view(release: str, package: str, version: str, corpus: dict, scratch: Path) -> tuple[Path, Path]:
    target, wheel = package_overlay(package, version, corpus, scratch)
    entries = torch_entries(release, corpus)
    entries += [entry for entry in target.iterdir() if entry.name not in ("bin", ".installed")]
    return site_view(scratch / "site", entries), wheel


def run_probe(view: Path, probe: str) -> tuple[str, str, float]:
    """(outcome, short message, seconds) of the probe in a fresh python with the view first on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(view), "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    started = time.perf_counter()
    try:
        completed = subprocess.run([sys.executable, "-c", probe + "print('PROBE-OK')\n"], capture_output=True,
                                   text=True, env=env, timeout=RUN_TIMEOUT, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return "timeout", f"no answer in {RUN_TIMEOUT} s", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if completed.returncode == 0 and completed.stdout.strip().endswith("PROBE-OK"):
        return "works", "", seconds
    lines = [line.strip() for line in completed.stderr.splitlines() if line.strip() and "Warning" not in line]
    # the exception's own line, not the tail of a many-line message (a dispatcher error lists every key)
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]
    last = (raised[-1] if raised else lines[-1] if lines else f"exit {completed.returncode}")[:240]
    if completed.returncode < 0:
        return "crashes", f"{signal.Signals(-completed.returncode).name}: {last}"[:240], seconds
    imported = "IMPORTED" in completed.stdout
    return ("call-fails" if imported else "import-fails"), last, seconds


def judged(report: abi.CheckReport, globs: list[str]) -> list[abi.ExtensionCheck]:
    return [item for item in report.extensions if any(fnmatch.fnmatch(item.path, glob) for glob in globs)]


def mix_verdict(extensions: list[abi.ExtensionCheck]) -> str:
    verdicts = {item.verdict for item in extensions}
    return next((verdict for verdict in ORDER if verdict in verdicts), abi.COMPATIBLE if not verdicts else
                sorted(verdicts)[0])


def check_mix(view: Path, globs: list[str]) -> tuple[str, str, float, int]:
    started = time.perf_counter()
    report = abi.check_site_packages(view)
    seconds = time.perf_counter() - started
    extensions = judged(report, globs)
    reasons = [f"{item.path}: {item.verdict}" + (f" ({item.missing[0].symbol})" if item.missing else "")
               for item in extensions if item.verdict != abi.COMPATIBLE]
    return mix_verdict(extensions), "; ".join(reasons)[:400], seconds, len(extensions)


def mixes(corpus: dict, releases: list[str] | None, packages: list[str] | None) -> list[tuple[str, str, str]]:
    """(torch release, package, version), neighbours first: the versions built for each release, then those one
    release away, and so on (an interrupted run has measured the mixes people meet most)."""
    chosen = []
    for release in corpus["releases"]:
        if releases and release not in releases:
            continue
        minor = int(release.split(".")[1])
        for package, spec in corpus["packages"].items():
            if packages and package not in packages:
                continue
            for version, built_for in spec["versions"].items():
                chosen.append((abs(int(built_for.split(".")[1]) - minor), release, package, version))
    return [(release, package, version) for _, release, package, version in sorted(chosen)]


def measure(arguments: argparse.Namespace, corpus: dict) -> None:
    done = set()
    out = Path(arguments.out)
    if out.exists():
        done = {(row["torch"], row["package"], row["version"]) for row in map(json.loads, out.read_text().splitlines())}
    for release, package, version in mixes(corpus, arguments.releases, arguments.packages):
        if (release, package, version) in done:
            continue
        spec = corpus["packages"][package]
        with tempfile.TemporaryDirectory(prefix="abi-corpus-") as scratch:
            try:
                view, wheel = mix_view(release, package, version, corpus, Path(scratch))
            except (RuntimeError, subprocess.SubprocessError) as error:
                print(f"{release} {package} {version}: cannot assemble: {str(error)[-300:]}", file=sys.stderr)
                continue
            verdict, why, seconds_check, count = check_mix(view, spec["judge"])
            outcome, message, seconds_real = run_probe(view, spec["probe"])
        row = {"torch": release, "package": package, "version": version, "built_for": spec["versions"][version],
               "wheel": wheel.name, "sha256": sha256(wheel), "outcome": outcome, "message": message,
               "verdict_when_measured": verdict, "why": why, "extensions": count,
               "seconds_check": round(seconds_check, 2), "seconds_real": round(seconds_real, 2)}
        with open(out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(f"{release} {package} {version} (for {row['built_for']}): {outcome} {message[:80]} | check: "
              f"{verdict} ({seconds_check:.1f} s)", file=sys.stderr, flush=True)


def write_truth(rows_file: Path, truth: Path) -> None:
    fields = ("torch", "package", "version", "built_for", "wheel", "sha256", "outcome", "message")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    rows = sorted({(row["torch"], row["package"], row["version"]): row for row in rows}.values(),
                  key=lambda row: (row["torch"], row["package"], _key(row["built_for"])))
    for row in rows:  # the scratch view's path says nothing: "SITE/torchao/_C.abi3.so: undefined symbol: ..."
        row["message"] = re.sub(r"/\S*?/abi-corpus-[^/]+/site/", "SITE/", row["message"])
    truth.write_text(json.dumps([{field: row[field] for field in fields} for row in rows], indent=1) + "\n")


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split(".") if part.isdigit())


def classify(verdict: str, outcome: str) -> str:
    """agree / false alarm / miss / uncertain-works / uncertain-breaks."""
    works = outcome == "works"
    if verdict == UNCERTAIN:
        return "uncertain-works" if works else "uncertain-breaks"
    if verdict in abi.LOADS:
        return "agree" if works else "miss"
    return "false alarm" if works else "agree"


def confusion(rows: list[dict], key: str = "verdict") -> str:
    kinds = ("agree", "false alarm", "miss", "uncertain-works", "uncertain-breaks")
    table: dict[tuple[str, str], dict[str, int]] = {}
    for row in rows:
        pair = (row["torch"][:3], row["built_for"])
        table.setdefault(pair, dict.fromkeys(kinds, 0))[classify(row[key], row["outcome"])] += 1
    lines = ["| torch | built for | mixes | " + " | ".join(kinds) + " |", "|---|---|---" + "|---" * len(kinds) + "|"]
    for (release, built), counts in sorted(table.items(), key=lambda item: (_key(item[0][0]), _key(item[0][1]))):
        lines.append(f"| {release} | {built} | {sum(counts.values())} | "
                     + " | ".join(str(counts[kind]) for kind in kinds) + " |")
    totals = {kind: sum(counts[kind] for counts in table.values()) for kind in kinds}
    lines.append(f"| all | | {sum(totals.values())} | " + " | ".join(str(totals[kind]) for kind in kinds) + " |")
    return "\n".join(lines)


def judge(arguments: argparse.Namespace, corpus: dict) -> None:
    rows = [row for row in json.loads(Path(arguments.truth).read_text())
            if (not arguments.releases or row["torch"] in arguments.releases)
            and (not arguments.packages or row["package"] in arguments.packages)]
    seconds = []
    cache = _judged_cache(arguments.judged)
    for row in rows:
        spec = corpus["packages"][row["package"]]
        key = (row["torch"], row["package"], row["version"])
        if key in cache:  # judged by this code before (--judged): verdict, why, seconds
            row["verdict"], row["why"], took = cache[key]
        else:
            with tempfile.TemporaryDirectory(prefix="abi-corpus-") as scratch:
                view, _ = mix_view(row["torch"], row["package"], row["version"], corpus, Path(scratch))
                row["verdict"], row["why"], took, _ = check_mix(view, spec["judge"])
            if arguments.judged:
                with open(arguments.judged, "a") as handle:
                    handle.write(json.dumps([*key, row["verdict"], row["why"], took]) + "\n")
        seconds.append(took)
        kind = classify(row["verdict"], row["outcome"])
        print(f"{row['torch']} {row['package']} {row['version']} (for {row['built_for']}): {row['outcome']} | "
              f"{row['verdict']} -> {kind} {row['why'][:160]}", file=sys.stderr, flush=True)
    if arguments.json:
        print(json.dumps(rows, indent=1))
    print(confusion(rows))
    if seconds:
        print(f"\n{len(rows)} mixes; check median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s")


FIXTURES = ROOT / "tests" / "fixtures" / "abi" / "corpus"


def extract(arguments: argparse.Namespace, corpus: dict) -> None:
    """Small recorded samples for tests/unit/test_abi_corpus.py: per mix TORCH:PACKAGE:VERSION, the judged extension
    whose verdict decides the mix, reduced to what `check` reads of it - its DT_NEEDED torch libraries, its
    undefined symbols that torch defines or nobody does (with the ABI twins torch exports), its distribution's pin
    - and the truth row. The unit test rebuilds tiny ELF files from them."""
    truth = {(row["torch"], row["package"], row["version"]): row for row in json.loads(Path(arguments.truth).read_text())}
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for sample in arguments.sample:
        release, package, version = sample.split(":")
        row = truth[(release, package, version)]
        with tempfile.TemporaryDirectory(prefix="abi-corpus-") as scratch:
            view, _ = mix_view(release, package, version, corpus, Path(scratch))
            report = abi.check_site_packages(view)
            extensions = judged(report, corpus["packages"][package]["judge"])
            chosen = next(item for verdict in ORDER for item in extensions if item.verdict == verdict)
            document = _reduced(view, chosen, report)
        document["truth"] = {field: row[field] for field in ("torch", "package", "version", "built_for", "wheel",
                                                             "sha256", "outcome", "message")}
        document["verdict"] = chosen.verdict
        name = f"{release}_{package}_{version}.json"
        (FIXTURES / name).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {chosen.path} {chosen.verdict}, {len(document['undefined'])} symbols", file=sys.stderr)


def _reduced(view: Path, extension: abi.ExtensionCheck, report: abi.CheckReport) -> dict:
    own = abi.read_elf_file(view / extension.path)
    torch_libraries = {path.name: abi.read_elf_file(path) for path in sorted((view / "torch" / "lib").glob("*.so*"))}
    missing = {item.symbol: item.twin for item in extension.missing}
    defines: dict[str, list[str]] = {}
    undefined = []
    for symbol in own.undefined:
        provider = next((name for name, library in torch_libraries.items() if symbol.name in library.defined), None)
        if provider is None and symbol.name not in missing:
            continue  # bound by libstdc++, libc, python...: not what the verdicts hinge on
        undefined.append([symbol.name, symbol.weak])
        if provider is not None:
            defines.setdefault(provider, []).append(symbol.name)
        twin = missing.get(symbol.name)
        if twin:
            owner = next(name for name, library in torch_libraries.items() if twin in library.defined)
            defines.setdefault(owner, []).append(twin)
    needed = [name for name in own.needed if name in torch_libraries]
    for name in needed:
        defines.setdefault(name, [])
    strings, headers = _header_fingerprint(view / extension.path, view / "torch" / "include")
    python = view / "torch" / "lib" / "libtorch_python.so"
    return {"extension": extension.path, "distribution": extension.distribution,
            "requires_torch": extension.requires_torch, "torch_version": report.torch_version,
            "needed": needed, "undefined": undefined, "torch_defines": {name: sorted(set(symbols)) for name, symbols
                                                                       in defines.items()},
            "torch_needed": {name: [item for item in torch_libraries[name].needed if item in defines]
                             for name in defines if any(item in defines for item in torch_libraries[name].needed)},
            "defines": sorted(name for name in own.defined if TORCH_TYPEINFO.match(name)),
            "strings": strings, "include": headers,
            "pybind11": {"extension": _pybind11(view / extension.path),
                         "torch": _pybind11(python) if python.exists() else None}}


# What headers.py and check._with_pybind11 read of a binary besides its symbols: assertion sites (the stringized
# condition, NUL before it, and the message), pybind11's internals id, torch types' typeinfo.
ASSERTION = re.compile(rb'[^\x00]{0,1024} INTERNAL ASSERT FAILED at "[^"\x00\n]{1,512}":[0-9]{1,7}, please report a bug')
PYBIND11 = re.compile(rb"__pybind11_internals_v[0-9]+[A-Za-z0-9_]*__")
TORCH_TYPEINFO = re.compile(r"^_ZTIN(?:3c10|2at|5torch|4c10d|6caffe2)[0-9]")
CONTEXT_LINES = 40  # header lines kept around each site: DRIFT_LINES and the lines a condition may wrap onto


def _header_fingerprint(binary: Path, include: Path) -> tuple[list[str], dict[str, dict]]:
    """The binary's assertion-site strings, and of each header they name the lines of this torch's copy around
    the sites (the rest of the file is not needed: the rule reads the lines near each site)."""
    data = binary.read_bytes()
    strings = sorted({match.group(0).decode("latin-1") for match in ASSERTION.finditer(data)})
    headers: dict[str, dict] = {}
    for text in strings:
        found = re.search(r'at "(?:.*?/)?(?:torch/include/|aten/src/)?((?:ATen|c10|torch|caffe2)/[^"]+)":([0-9]+)',
                          text)
        path = include / found.group(1) if found else None
        if path is None or not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        entry = headers.setdefault(found.group(1), {"count": len(lines), "lines": {}})
        line = int(found.group(2))
        for number in range(max(1, line - CONTEXT_LINES), min(len(lines), line + CONTEXT_LINES) + 1):
            entry["lines"][str(number)] = lines[number - 1]
    return strings, headers


def _pybind11(binary: Path) -> str | None:
    found = PYBIND11.search(binary.read_bytes())
    return found.group(0).decode("ascii") if found else None


def _judged_cache(path: str | None) -> dict[tuple[str, str, str], tuple[str, str, float]]:
    if not path or not Path(path).exists():
        return {}
    items = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {(item[0], item[1], item[2]): (item[3], item[4], item[5]) for item in items}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("measure", "judge", "table", "extract"))
    parser.add_argument("--sample", nargs="*", default=[], help="extract: TORCH:PACKAGE:VERSION mixes of truth.json")
    parser.add_argument("--releases", nargs="*", help="torch releases (default: all of corpus.json)")
    parser.add_argument("--packages", nargs="*", help="packages (default: all of corpus.json)")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "abi-corpus-rows.jsonl"),
                        help="measure: JSON lines of the measured rows (appended; rows there are skipped)")
    parser.add_argument("--write-truth", action="store_true", help="measure/table: write truth.json from --out")
    parser.add_argument("--truth", default=str(TRUTH))
    parser.add_argument("--json", action="store_true", help="judge: print the judged rows as JSON")
    parser.add_argument("--judged", help="judge: JSON lines of verdicts already given by this code (appended; a "
                                          "cache for re-runs while nothing in abi/ changed)")
    arguments = parser.parse_args()
    corpus = load_corpus()
    if arguments.mode == "measure":
        started = time.perf_counter()
        measure(arguments, corpus)
        print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if arguments.mode in ("measure", "table"):
        rows = [json.loads(line) for line in Path(arguments.out).read_text().splitlines() if line.strip()]
        print(confusion(rows, "verdict_when_measured"))
        if arguments.write_truth:
            write_truth(Path(arguments.out), Path(arguments.truth))
    if arguments.mode == "judge":
        judge(arguments, corpus)
    if arguments.mode == "extract":
        extract(arguments, corpus)


if __name__ == "__main__":
    main()
