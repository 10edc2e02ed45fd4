"""Fixtures the unit tests share."""
from __future__ import annotations

import http.server
import threading
from typing import Iterator

import pytest

from fake_index import FakeIndex


@pytest.fixture(scope="session")
def index_server_started() -> Iterator[str]:
    """A local package index (fake_index.FakeIndex) on 127.0.0.1, for the whole session."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeIndex)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture()
def index_server(index_server_started: str) -> str:
    """The local index's base URL, serving nothing until the test puts routes in FakeIndex.routes."""
    FakeIndex.routes, FakeIndex.no_ranges, FakeIndex.requests = {}, False, []
    return index_server_started
