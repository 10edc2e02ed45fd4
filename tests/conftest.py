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


def pytest_configure(config: pytest.Config) -> None:
    """In CI every suite must really run: a missing engine or torch_xla is a failure, not a skip."""
    import importlib.util
    import os

    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and importlib.util.find_spec("torch_xla") is None:
        raise pytest.UsageError("CI=true but torch_xla is not importable: tests/xla would be skipped; "
                                "run ci/setup.sh (it installs torch_xla into .venv)")
