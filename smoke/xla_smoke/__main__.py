"""`python -m xla_smoke`."""
from __future__ import annotations

import sys

from xla_smoke.cli import main

if __name__ == "__main__":
    sys.exit(main())
