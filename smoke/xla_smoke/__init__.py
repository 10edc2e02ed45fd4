"""xla_smoke: the smoke suite that runs inside every xla-images container image.

Run it as `python -m xla_smoke`. It imports only torch, torch_xla, numpy and the standard library, so it runs
in the bare image. The modules that need torch import it lazily: `--list` and usage errors work without it,
and a torch_xla that cannot even be imported (an ABI mismatch, say) is reported as a failed check rather than a
traceback.
"""
from __future__ import annotations

SUITE_NAME = "xla_smoke"
SCHEMA_VERSION = 1

# Exit codes; the host side relies on them.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
