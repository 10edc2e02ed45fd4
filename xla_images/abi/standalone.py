"""The ABI tool as one file that runs anywhere python does: `python abi.pyz inspect|check PATH [--json]`.

Wheel builds (wheel-builds/build-wheels.sh) and the in-image check (run/checking/image_checks) run the tool where
xla_images is not installed. The zipapp holds this package, the two modules of xla_images it imports (the
package's `__init__` and `errors`) and nothing else: the tool needs only the standard library. Its bytes depend only
on the sources (fixed member order and timestamps).

`zipapp_bytes` is the toolkit's one zipapp recipe: this tool and the image's `xla-images-check`
(run/building/check_tool.py) are both packed by it. It lives here because abi/ imports only errors of
xla_images, so this module can use it and run/ may import it.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Mapping

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent.parent
ENTRY = "xla_images.abi.cli"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every member's time: zip's earliest, so equal sources give equal bytes


def zipapp_bytes(entry: str, members: Mapping[str, Path], shebang: str = "") -> bytes:
    """A zipapp whose `__main__` runs `sys.exit(main())` of module `entry`, holding `members` (member name ->
    source file) in sorted order, deflated, every timestamp the same; `shebang` (a `#!...` line) goes before
    the archive (python finds a zip's directory from its end, so a prefix is allowed)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), f"import sys\nfrom {entry} import main\n"
                                                                 "sys.exit(main())\n")
        for name, source in sorted(members.items()):
            archive.writestr(zipfile.ZipInfo(name, _EPOCH), source.read_bytes())
    return shebang.encode() + buffer.getvalue()


def sources() -> dict[str, Path]:
    """Member name -> source file, for every module the standalone tool needs."""
    members = {f"xla_images/{name}": ROOT / "xla_images" / name for name in ("__init__.py", "errors.py")}
    members.update({f"xla_images/abi/{path.name}": path for path in sorted(PACKAGE.glob("*.py"))})
    return members


def write_zipapp(target: Path) -> Path:
    """Write the one-file tool to target (e.g. abi.pyz) and return it."""
    target = Path(target)
    target.write_bytes(zipapp_bytes(ENTRY, sources()))
    return target
