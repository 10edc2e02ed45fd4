#!/usr/bin/env python3
"""xla-images command line. Same as the `xla-images` console script; run `./build.py --help`."""
import sys

try:
    # xla_images.__main__ turns a missing third-party dependency into a one-line error naming how to install the
    # pinned set (exit 2); it and xla_images.extras import only the standard library, so this import cannot miss
    # one. Ctrl-C while it imports (before the CLI's own handler exists) is an interrupt too: exit 130, no
    # traceback; nothing has been written yet.
    from xla_images.__main__ import main
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    sys.exit(130)

if __name__ == "__main__":
    main()
