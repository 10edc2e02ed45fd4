"""Fixtures the unit tests share."""
from __future__ import annotations

from typing import Iterator

import pytest

from support.host import serving
from support.index import FakeIndex


@pytest.fixture(scope="session")
def index_server_started() -> Iterator[str]:
    """A local package index (support.index.FakeIndex) on 127.0.0.1, for the whole session."""
    with serving(FakeIndex) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture()
def index_server(index_server_started: str) -> str:
    """The local index's base URL, serving nothing until the test puts routes in FakeIndex.routes."""
    FakeIndex.reset()
    return index_server_started
