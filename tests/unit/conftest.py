"""Fixtures the unit tests share."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from support.host import self_signed
from support.index import FakeIndex


@pytest.fixture(scope="session")
def index_server_started() -> Iterator[str]:
    """A local package index (support.index.FakeIndex) on 127.0.0.1, for the whole session."""
    with FakeIndex.host() as index:
        yield index.url


@pytest.fixture()
def index_server(index_server_started: str) -> str:
    """The local index's base URL, serving nothing until the test puts routes in FakeIndex.routes."""
    FakeIndex.reset()
    return index_server_started


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a self-signed cert.pem/key.pem for 127.0.0.1 (support.host.self_signed)."""
    return self_signed(tmp_path_factory.mktemp("tls"))
