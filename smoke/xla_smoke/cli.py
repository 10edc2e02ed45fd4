"""Command line of `python -m xla_smoke`. Exit codes: 0 all passed, 1 a check failed or errored, 2 usage.

Only the standard library is imported until the arguments are known to be good, so `--list` and usage errors
are instant and work even where torch_xla cannot be imported.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from xla_smoke import EXIT_FAILED, EXIT_OK, EXIT_USAGE, SUITE_NAME, checks, expectations, hostinfo
from xla_smoke.context import DEFAULT_LAYERS, DEFAULT_MIN_COMPILE_RATIO, DEFAULT_TRACE_REPEATS, Context
from xla_smoke.expectations import Expectations, UsageError

EXPECTATION_HELP = {
    "tag": "image tag",
    "abi": "C++ ABI: cxx11 or pre-cxx11",
    "python": "python version, e.g. 3.11",
    "torch": "torch version (local label like +cxx11 ignored)",
    "torch_xla": "torch_xla version",
    "libtpu": "libtpu version; empty string = no libtpu expected",
    "accelerator": "tpu or cpu",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse reports usage errors (exit 2) and --help (exit 0) this way
        return int(exit_.code or 0)
    try:
        if args.list:
            _print_list()
            return EXIT_OK
        context = _context(args)
        selected = _selection(args.only, args.skip)
    except UsageError as exc:
        print(f"{SUITE_NAME}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run(context, selected, args)


def _run(context: Context, selected: list[str], args: argparse.Namespace) -> int:
    # Must be set before torch_xla is first imported, which happens inside the runner.
    os.environ.setdefault("PJRT_DEVICE", hostinfo.default_pjrt_device())
    from xla_smoke import report, runner

    result = runner.run_suite(context, selected)
    if args.report_dir is not None:
        for path in report.write(result, args.report_dir):
            print(f"[xla_smoke] wrote {path}", file=sys.stderr)
    print(report.to_json(result) if args.json else report.render_summary(result), flush=True)
    return EXIT_OK if report.succeeded(result) else EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {SUITE_NAME}",
        description="Smoke suite for an xla-images container image. Expectations default to the image's "
                    "XLA_IMAGES_* environment; the --expect-* flags override them.")
    parser.add_argument("--report-dir", type=Path, help="write report.json and junit.xml here")
    parser.add_argument("--only", metavar="A,B", help="run only these checks (see --list)")
    parser.add_argument("--skip", metavar="A,B", help="do not run these checks")
    parser.add_argument("--layers", type=_layer_list, default=DEFAULT_LAYERS, metavar="N[,N...]",
                        help="decoder layer counts for compile_time (default %(default)s); "
                             "the largest is the headline figure")
    parser.add_argument("--trace-repeats", type=_positive_int, default=DEFAULT_TRACE_REPEATS, metavar="N",
                        help="timed repeats for tracing (default %(default)s)")
    parser.add_argument("--min-compile-ratio", type=_non_negative_float, default=DEFAULT_MIN_COMPILE_RATIO,
                        metavar="X", help="compile_time fails when loop/scan compile time is below X "
                                          "(default %(default)s: scan_layers must win by a margin)")
    for field, help_text in EXPECTATION_HELP.items():
        parser.add_argument(expectations.flag_name(field), dest=f"expect_{field}", metavar="VALUE",
                            help=f"{help_text} (default ${expectations.env_var(field)})")
    parser.add_argument("--json", action="store_true", help="print the report JSON instead of the summary")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    return parser


def _context(args: argparse.Namespace) -> Context:
    overrides = {field: getattr(args, f"expect_{field}") for field in EXPECTATION_HELP}
    expected: Expectations = expectations.load(os.environ, overrides)
    return Context(expectations=expected, layers=tuple(args.layers), trace_repeats=args.trace_repeats,
                   min_compile_ratio=args.min_compile_ratio)


def _selection(only: Optional[str], skip: Optional[str]) -> list[str]:
    known = checks.names()
    wanted = _names(only, "--only") if only is not None else known
    unwanted = set(_names(skip, "--skip")) if skip is not None else set()
    selected = [name for name in known if name in wanted and name not in unwanted]
    if not selected:
        raise UsageError("no checks left to run after --only/--skip")
    return selected


def _names(text: str, flag: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in checks.CHECKS]
    if unknown:
        raise UsageError(f"{flag}: unknown check {', '.join(unknown)}; known: {', '.join(checks.names())}")
    if not names:
        raise UsageError(f"{flag} needs at least one check name")
    return names


def _print_list() -> None:
    width = max(len(name) for name in checks.CHECKS)
    for name, (_, description) in checks.CHECKS.items():
        print(f"{name:{width}}  {description}")


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"layer counts must be positive integers: {text!r}")
    return tuple(sorted(set(values)))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0: {text!r}")
    return value
