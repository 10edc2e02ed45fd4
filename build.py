#!/usr/bin/env python3
"""xla-images command line. Same as the `xla-images` console script; run `./build.py --help`."""
import sys

try:
    from xla_images.cli import main
except ModuleNotFoundError as error:
    # A missing third-party dependency, not a bug of ours: say how to get the pinned set instead of a traceback.
    if (error.name or "").partition(".")[0] == "xla_images":
        raise
    sys.exit(f"build.py: the dependency {error.name!r} is not installed for {sys.executable}; install the pinned "
             "set with `pip install -e .`, or run `bash ci/setup.sh` and use .venv/bin/python")

if __name__ == "__main__":
    main()
