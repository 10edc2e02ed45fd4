#!/usr/bin/env python3
"""xla-images command line. Same as the `xla-images` console script; run `./build.py --help`."""
from xla_images.cli import main

if __name__ == "__main__":
    main()
