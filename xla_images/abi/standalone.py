"""The ABI tool as one file that runs anywhere python does: `python abi.pyz inspect|check PATH [--json]`.

Wheel builds (wheel-builds/build-wheels.sh) and the in-image check (run/checking/image_checks) run the tool where
xla_images is not installed. The zipapp holds this package, the two modules of xla_images it imports (the
package's `__init__` and `errors`) and nothing else: the tool needs only the standard library. Its bytes depend only
on the sources (fixed member order and timestamps).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent.parent
_MAIN = "import sys\nfrom xla_images.abi.cli import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def sources() -> dict[str, Path]:
    """Member name -> source file, for every module the standalone tool needs."""
    members = {f"xla_images/{name}": ROOT / "xla_images" / name for name in ("__init__.py", "errors.py")}
    members.update({f"xla_images/abi/{path.name}": path for path in sorted(PACKAGE.glob("*.py"))})
    return members


def write_zipapp(target: Path) -> Path:
    """Write the one-file tool to target (e.g. abi.pyz) and return it."""
    target = Path(target)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN)
        for name, source in sorted(sources().items()):
            archive.writestr(zipfile.ZipInfo(name, _EPOCH), source.read_bytes())
    return target
