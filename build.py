#!/usr/bin/env python3
"""xla-images command line. Same as the `xla-images` console script; run `./build.py --help`."""
# xla_images.__main__ turns a missing third-party dependency into a one-line error naming how to install the
# pinned set (exit 2); it and xla_images.extras import only the standard library, so this import cannot miss one.
from xla_images.__main__ import main

if __name__ == "__main__":
    main()
