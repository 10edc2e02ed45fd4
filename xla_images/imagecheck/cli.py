"""The command line of `xla-images-check`: the checks of `check`, plain text or `--json`, exit 0 / 1 / 2."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from ..errors import XlaImagesError
from .check import CONSTRAINTS, VENV, CheckResult, check_image
from .loading import SECONDS

PROG = "xla-images-check"
DESCRIPTION = ("Does this image (built FROM an xla-images image) still hold its flavour? torch, torch_xla and "
               "libtpu as pinned and installed once, every requirement satisfied, every native module importable "
               "in a fresh python of the venv (torch first). Exit 0 yes, 1 no (each problem named), 2 the image "
               "or its inputs cannot be read.")
SHOWN = 5  # information lines printed per list (--json has them all)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code is 2 too; one line, the same prefix
        print(f"{PROG}: error [check-usage]: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--json", action="store_true", help="machine-readable output (for CI)")
    parser.add_argument("--venv", default=os.environ.get("VIRTUAL_ENV") or VENV,
                        help="the python environment to check (default: $VIRTUAL_ENV, else %(default)s)")
    parser.add_argument("--constraints", default=CONSTRAINTS, help="the image's pins (default: %(default)s)")
    parser.add_argument("--abi", default=os.environ.get("XLA_IMAGES_ABI") or None,
                        help="the ABI torch must have: cxx11 or pre-cxx11 (default: $XLA_IMAGES_ABI)")
    parser.add_argument("--no-pip-check", action="store_true", help="skip the requirements (pip check's question)")
    parser.add_argument("--no-import", action="store_true", help="skip the imports (versions and requirements only)")
    parser.add_argument("--import-timeout", type=float, default=SECONDS,
                        help="seconds one python may take to import its modules (default: %(default)s)")
    arguments = parser.parse_args(argv)
    try:
        result = check_image(Path(arguments.venv), Path(arguments.constraints), arguments.abi,
                             run_pip=not arguments.no_pip_check, run_imports=not arguments.no_import,
                             import_seconds=arguments.import_timeout)
    except XlaImagesError as error:
        # One line: CI logs show it whole, and a wrapper can grep it.
        hint = f" (hint: {error.hint})" if error.hint else ""
        print(f"{PROG}: error [{error.rule}]: {error.message}{hint}", file=sys.stderr)
        return 2
    except OSError as error:  # a file vanished or became unreadable while the checks walked the venv
        print(f"{PROG}: error [check-venv]: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=2) if arguments.json else format_result(result))
    return 0 if result.ok else 1


def _listed(what: str, items: list[str]) -> list[str]:
    if not items:
        return []
    more = f" (and {len(items) - SHOWN} more: --json lists them)" if len(items) > SHOWN else ""
    return [f"info: {len(items)} {what}: {', '.join(items[:SHOWN])}{more}"]


def format_result(result: CheckResult) -> str:
    versions = ", ".join(f"{name} {installed or 'missing'}" for name, (_, installed) in result.packages.items())
    head = f"{PROG}: {result.tag or 'unknown flavour'} in {result.venv}: {versions}"
    info = [*_listed("shared object(s) no import loaded (not judged)", result.not_loaded),
            *_listed("'.so' file(s) that are not ELF (nothing imported them)", result.not_elf),
            *_listed(".pth file(s) run at every start of the venv's python", result.pth_files),
            f"info: {result.exercised()}"]
    if result.ok:
        return "\n".join([head, *info, f"ok: as pinned, requirements satisfied, {len(result.imported)} native "
                                       f"module(s) import [{result.seconds:.1f} s]"])
    lines = [head, *(f"problem: {problem.message}" for problem in result.problems), *info,
             f"{len(result.problems)} problem(s): this image no longer holds its flavour [{result.seconds:.1f} s]"]
    return "\n".join(lines)
