"""`python -m xla_images` and the `xla-images` console script.

Importing the CLI imports every third-party dependency; one that is missing (an install that skipped them)
becomes one line naming how to install the pinned set, exit 2, rather than a traceback.
"""
from __future__ import annotations

import sys

from .extras import missing_dependency_message


def main() -> None:
    try:
        from .cli import main as cli_main
    except ModuleNotFoundError as error:
        message = missing_dependency_message(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        sys.exit(2)
    cli_main()


if __name__ == "__main__":
    main()
