"""`python -m xla_smoke`."""
from __future__ import annotations

import os
import sys
import tempfile

from xla_smoke.cli import main


def remove_torch_temp_dir() -> None:
    """torch.distributed.nn.jit.instantiator makes a temp dir when it is imported (torch_xla imports it) and
    leaves its removal to an exit hook, which os._exit skips: every run would leave a /tmp/tmpXXXXXXXX behind."""
    instantiator = sys.modules.get("torch.distributed.nn.jit.instantiator")
    temp_dir = getattr(instantiator, "_TEMP_DIR", None)
    if isinstance(temp_dir, tempfile.TemporaryDirectory):
        temp_dir.cleanup()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    remove_torch_temp_dir()
    # Leave without the interpreter's exit hooks: torch_xla's hook aborts the process (SIGABRT) when its
    # runtime failed to start (PJRT_DEVICE=TPU without a TPU, say), which would replace exit code 1 by a crash.
    # Everything the suite produces is written and flushed by now, and every check has waited for its device;
    # the one exit hook whose work must still happen (torch's temp dir) ran just above.
    os._exit(code)
