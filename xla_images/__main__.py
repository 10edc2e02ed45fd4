"""`python -m xla_images` and the `xla-images` console script.

Importing the CLI imports every third-party dependency; one that is missing (an install that skipped them)
becomes one line naming how to install the pinned set, exit 2, rather than a traceback. Ctrl-C (SIGINT) at any
moment from here on, start-up included, is exit 130 and one line `interrupted`.
"""
from __future__ import annotations

import sys

from .extras import missing_dependency_message


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT; the CLI uses it too


def main() -> None:
    try:
        from .cli import main as cli_main
    except ModuleNotFoundError as error:
        message = missing_dependency_message(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C while importing (click, jinja2, docker...): nothing has run yet
        print("interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    try:
        cli_main()
    except KeyboardInterrupt:  # Ctrl-C in the CLI's own error handling, after its handler let go
        print("interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)


if __name__ == "__main__":
    main()
