"""Markers follow the directory: tests/unit -> unit, tests/engine -> engine, tests/xla -> xla.

No test is random: the hypothesis profile below is loaded for every run, so every property test draws the same
examples on every machine (derandomize), keeps no example database between runs and has a fixed budget unless
it names its own. Random exploration belongs in benchmarks/ (e.g. bench_hostile.py --random).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).parent

# deadline and too_slow judge wall-clock time, which a shared 2-core CI machine does not keep: off, so a loaded
# machine cannot fail a test the idle one passes. Timing targets are benchmarks' business.
settings.register_profile("deterministic", derandomize=True, database=None, max_examples=100, print_blob=True,
                          deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("deterministic")


def _derandomize(item: pytest.Item) -> None:
    """A property test whose own @settings says derandomize=False (or keeps a database) runs derandomized all
    the same: its budget stays, its examples become the same on every run."""
    test = getattr(item, "obj", None)
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if own is not None and (not own.derandomize or own.database is not None):
        test._hypothesis_internal_use_settings = settings(own, derandomize=True, database=None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _derandomize(item)
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
