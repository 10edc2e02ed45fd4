"""`python -m xla_smoke`."""
from __future__ import annotations

import os
import sys

from xla_smoke.cli import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's exit hooks: torch_xla's hook aborts the process (SIGABRT) when its
    # runtime failed to start (PJRT_DEVICE=TPU without a TPU, say), which would replace exit code 1 by a crash.
    # Everything the suite produces is written and flushed by now, and every check has waited for its device.
    os._exit(code)
