"""Markers follow the directory: tests/unit -> unit, tests/engine -> engine, tests/xla -> xla."""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if kind in ("unit", "engine", "xla"):
            item.add_marker(getattr(pytest.mark, kind))
