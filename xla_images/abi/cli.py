"""The standalone command line: `python -m xla_images.abi inspect|check PATH [--json]`, or the same through the
one-file copy that `standalone.write_zipapp` makes (`python abi.pyz ...`): exit 0 fine (compatible or pin
mismatch), 1 a definite mismatch (abi/version/layout/python mismatch, missing library), 2 usage error, 3 uncertain. It reads paths only; images are read by `build.py abi`, which
needs the engine.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from ..errors import XlaImagesError
from .check import check_path_target
from .files import is_path_target
from .inspection import inspect_path_target
from .report import format_check, format_package
from .words import EXIT_UNCERTAIN, RULE_IMAGE, UNCERTAIN, usage_error

DESCRIPTION = "Read the C++ ABI of torch binaries and predict whether extensions load beside a torch."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="abi", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("inspect", "ABI of each shared object of a wheel, directory or .so file"),
                       ("check", "would the extensions of a site-packages load beside its torch?")):
        command = commands.add_parser(name, help=text)
        command.add_argument("target", help="wheel, directory (site-packages) or .so file")
        command.add_argument("--json", action="store_true", help="machine-readable output")
    arguments = parser.parse_args(argv)
    try:
        if not is_path_target(arguments.target):
            raise usage_error(f"{arguments.target} is not an existing path; the standalone tool reads paths only",
                              rule=RULE_IMAGE, hint="read images with `build.py abi inspect|check IMAGE`")
        if arguments.command == "inspect":
            _emit(inspect_path_target(arguments.target), arguments.json, format_package)
            return 0
        report = check_path_target(arguments.target)
        _emit(report, arguments.json, format_check)
        return 0 if report.compatible else EXIT_UNCERTAIN if report.verdict == UNCERTAIN else 1
    except XlaImagesError as error:
        print(error.render(explain=False), file=sys.stderr)  # no build.py beside the standalone tool
        return error.exit_code


def _emit(report, as_json: bool, formatter: Callable) -> None:
    print(json.dumps(report.to_json(), indent=2) if as_json else formatter(report))
