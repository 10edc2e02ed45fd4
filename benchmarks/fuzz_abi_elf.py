"""Random exploration of the ELF reader (issue 19): mutate real g++ libraries at random for a time budget and print
what was found — a time per example, the slowest inputs, any exception other than CorruptElf, peak memory.

    python benchmarks/fuzz_abi_elf.py [--seconds 60] [--seed N] [--keep DIR]

CI runs the same mutations derandomized with a fixed budget (tests/unit/test_abi_hostile.py); this script is where
new shapes are looked for. Each example runs under SIGALRM (--limit seconds, default 5) in this process, whose
address space is capped (--memory MiB, default 2048): a loop or a runaway allocation is reported, not waited for.
A finding is printed with the random seed that replays it and, with --keep, written to DIR.
"""
from __future__ import annotations

import argparse
import io
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]

from elf_mutations import compile_library, mutate  # noqa: E402

from xla_images import abi  # noqa: E402


class Overtime(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Overtime()


def seeds(directory: Path) -> dict[str, bytes]:
    """Real libraries: plain, with a version-definition table, and an extension linking a library."""
    (directory / "versions.map").write_text("XLA_TEST_1 { global: *; };\n")
    libraries = {
        "libstrings.so": compile_library("strings.cpp", directory / "libstrings.so"),
        "libversioned.so": compile_library("strings.cpp", directory / "libversioned.so",
                                           f"-Wl,--version-script={directory / 'versions.map'}"),
    }
    compile_library("fake_torch.cpp", directory / "torch" / "libtorch.so")
    libraries["extension.so"] = compile_library("extension.cpp", directory / "extension.so", "-L",
                                                str(directory / "torch"), "-ltorch")
    return {name: path.read_bytes() for name, path in libraries.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    parser.add_argument("--limit", type=int, default=5, help="seconds one example may take")
    parser.add_argument("--memory", type=int, default=2048, help="address-space cap of this process, MiB")
    parser.add_argument("--keep", type=Path, default=None, help="write findings here")
    arguments = parser.parse_args()
    seed = arguments.seed if arguments.seed is not None else time.time_ns() % (1 << 32)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-abi-elf-"))
    try:
        libraries = seeds(scratch)
    finally:
        shutil.rmtree(scratch)
    resource.setrlimit(resource.RLIMIT_AS, (arguments.memory << 20, arguments.memory << 20))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    findings: list[tuple[str, str, int, str]] = []
    slowest: list[tuple[float, str, str, int]] = []
    outcomes = {"read": 0, "CorruptElf": 0}
    examples, started = 0, time.monotonic()
    print(f"seed {seed}; budget {arguments.seconds:.0f} s; {arguments.limit} s and {arguments.memory} MiB per example")
    while time.monotonic() - started < arguments.seconds:
        name = rng.choice(sorted(libraries))
        example_seed = rng.getrandbits(64)
        kind, data = mutate(libraries[name], random.Random(example_seed))
        examples += 1
        begin = time.perf_counter()
        signal.alarm(arguments.limit)
        try:
            info = abi.read_elf_dynamic(io.BytesIO(data))
            abi.classify_dynamic(info, name)
            outcomes["read"] += 1
        except abi.CorruptElf:
            outcomes["CorruptElf"] += 1
        except Overtime:
            findings.append((name, kind, example_seed, f"took more than {arguments.limit} s"))
        except BaseException as error:  # noqa: BLE001 - a finding is whatever escapes the reader
            findings.append((name, kind, example_seed, f"{type(error).__name__}: {str(error)[:160]}"))
        finally:
            signal.alarm(0)
        slowest.append((time.perf_counter() - begin, name, kind, example_seed))
        slowest = sorted(slowest, reverse=True)[:5]
        if findings and arguments.keep is not None and len(findings) <= 20 and findings[-1][2] == example_seed:
            arguments.keep.mkdir(parents=True, exist_ok=True)
            (arguments.keep / f"{name}.{example_seed}.so").write_bytes(data)
    elapsed = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{examples} examples in {elapsed:.1f} s ({examples / elapsed:.0f}/s): {outcomes['read']} read, "
          f"{outcomes['CorruptElf']} refused as CorruptElf, {len(findings)} findings; peak RSS {peak:.0f} MiB")
    print("slowest:")
    for seconds, name, kind, example_seed in slowest:
        print(f"  {seconds * 1000:8.1f} ms  {name:<16} {kind:<24} example seed {example_seed}")
    for name, kind, example_seed, what in findings[:20]:
        print(f"FINDING {name} {kind} example seed {example_seed}: {what}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
