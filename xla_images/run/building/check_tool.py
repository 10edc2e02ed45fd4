"""The image's `xla-images-check`: xla_images/imagecheck and xla_images/abi as one executable zipapp.

Its members are generate.plan.check_tool_sources (the same list the flavour id hashes), its entry point runs
xla_images.imagecheck, and its first line is a shebang naming the image's python, so the one file is the command
on PATH (`/opt/venv/bin/xla-images-check`). `-I` keeps PYTHONPATH and the user's site directory of a derived
image from shadowing the modules inside the zip. Packed by abi.standalone.zipapp_bytes, the toolkit's one zipapp
recipe: its bytes depend only on the sources (fixed order and times), so equal sources give an equal layer.
"""
from __future__ import annotations

from pathlib import Path

from ...abi.standalone import zipapp_bytes
from ...generate.plan import check_tool_sources
from ...names import VENV

SHEBANG = f"#!{VENV}/bin/python -IS\n"
ENTRY = "xla_images.imagecheck.cli"


def check_tool_bytes(shebang: str = SHEBANG) -> bytes:
    """The zipapp, shebang first."""
    return zipapp_bytes(ENTRY, check_tool_sources(), shebang)


def write_check_tool(target: Path, shebang: str = SHEBANG) -> Path:
    """Write the executable tool to target (mode 0755) and return it."""
    target = Path(target)
    target.write_bytes(check_tool_bytes(shebang))
    target.chmod(0o755)
    return target
