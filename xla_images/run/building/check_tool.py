"""The image's `xla-images-check`: xla_images/imagecheck and xla_images/abi as one executable zipapp.

Its members are generate.plan.check_tool_sources (the same list the flavour id hashes), its entry point runs
xla_images.imagecheck, and its first line is a shebang naming the image's python, so the one file is the command
on PATH (`/opt/venv/bin/xla-images-check`). `-I` keeps PYTHONPATH and the user's site directory of a derived
image from shadowing the modules inside the zip. Its bytes depend only on the sources (fixed order and times),
so equal sources give an equal layer.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

from ...generate.plan import check_tool_sources
from ...names import VENV

SHEBANG = f"#!{VENV}/bin/python -IS\n"
_MAIN = "import sys\nfrom xla_images.imagecheck.cli import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def check_tool_bytes(shebang: str = SHEBANG) -> bytes:
    """The zipapp, shebang first (python finds a zip's directory from its end: a prefix is allowed)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN)
        for name, source in sorted(check_tool_sources().items()):
            archive.writestr(zipfile.ZipInfo(name, _EPOCH), source.read_bytes())
    return shebang.encode() + buffer.getvalue()


def write_check_tool(target: Path, shebang: str = SHEBANG) -> Path:
    """Write the executable tool to target (mode 0755) and return it."""
    target = Path(target)
    target.write_bytes(check_tool_bytes(shebang))
    target.chmod(0o755)
    return target
