"""`python -m xla_images.abi ...`, and `python PATH/xla_images/abi ...` (the directory run as a script)."""
import sys
from pathlib import Path

if not __package__:  # run as a directory: the package's root must be importable, and nothing of this directory
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from xla_images.abi.cli import main  # noqa: E402

sys.exit(main())
