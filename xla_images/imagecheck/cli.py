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

PROG = "xla-images-check"
DESCRIPTION = ("Does this image (built FROM an xla-images image) still hold its flavour? torch, torch_xla and "
               "libtpu as pinned, `pip check` clean, every torch extension loadable. Exit 0 yes, 1 no (each "
               "problem named), 2 bad input.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--json", action="store_true", help="machine-readable output (for CI)")
    parser.add_argument("--venv", default=os.environ.get("VIRTUAL_ENV") or VENV,
                        help="the python environment to check (default: $VIRTUAL_ENV, else %(default)s)")
    parser.add_argument("--constraints", default=CONSTRAINTS, help="the image's pins (default: %(default)s)")
    parser.add_argument("--abi", default=os.environ.get("XLA_IMAGES_ABI") or None,
                        help="the ABI torch must have (default: $XLA_IMAGES_ABI)")
    parser.add_argument("--no-pip-check", action="store_true", help="skip `pip check`")
    arguments = parser.parse_args(argv)
    try:
        result = check_image(Path(arguments.venv), Path(arguments.constraints), arguments.abi,
                             run_pip=not arguments.no_pip_check)
    except XlaImagesError as error:
        # One line: CI logs show it whole, and a wrapper can grep it.
        hint = f" (hint: {error.hint})" if error.hint else ""
        print(f"{PROG}: error [{error.rule}]: {error.message}{hint}", file=sys.stderr)
        return error.exit_code
    except OSError as error:  # a file vanished or became unreadable while the checks walked the venv
        print(f"{PROG}: error [check-venv]: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=2) if arguments.json else format_result(result))
    return 0 if result.ok else 1


def format_result(result: CheckResult) -> str:
    versions = ", ".join(f"{name} {installed or 'missing'}" for name, (_, installed) in result.packages.items())
    head = f"{PROG}: {result.tag or 'unknown flavour'} in {result.venv}: {versions}"
    if result.ok:
        return (f"{head}\nok: as pinned, pip check clean, {result.extensions} torch extension(s) load "
                f"({result.abi_summary}) [{result.seconds:.1f} s]")
    lines = [head, *(f"problem: {problem.message}" for problem in result.problems),
             f"{len(result.problems)} problem(s): this image no longer holds its flavour [{result.seconds:.1f} s]"]
    return "\n".join(lines)
