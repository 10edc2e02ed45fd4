"""Fixtures the unit tests share."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from fs_shapes import Checkout, make_checkout
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


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Checkout:
    """A checkout (fs_shapes.make_checkout) made once a module; tests change copies of it (copy_checkout)."""
    return make_checkout(tmp_path_factory.mktemp("pristine"))
