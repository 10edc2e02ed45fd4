"""run.index against a local fake index: the simple API (JSON and HTML), METADATA by range requests, and the
answers it refuses, each with its rule. The real index is read by tests/unit/test_update_network.py."""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from fake_index import FakeIndex
from xla_images.errors import Failure
from xla_images.run.index import JSON_TYPE, Index, IndexFile

METADATA = ("Metadata-Version: 2.1\nName: torch_xla\nVersion: 9.1.0\nRequires-Dist: absl-py>=1.0.0\n"
            "Provides-Extra: tpu\nRequires-Dist: libtpu==0.0.99; extra == \"tpu\"\n")
WHEEL = "torch_xla-9.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"


def make_wheel(padding: int = 0) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("torch_xla/big.bin", b"\0" * padding)
        wheel.writestr("torch_xla/version.py", "__xla_gitrev__ = 'abcdef1234567'\n")
        wheel.writestr("torch_xla-9.1.0.dist-info/METADATA", METADATA)
    return buffer.getvalue()


def serve_wheel(base: str, padding: int = 0) -> IndexFile:
    FakeIndex.routes[f"/files/{WHEEL}"] = (200, "application/octet-stream", make_wheel(padding))
    return IndexFile(WHEEL, f"{base}/files/{WHEEL}")


def test_json_page_lists_files(index_server: str) -> None:
    page = {"meta": {"api-version": "1.1"}, "name": "torch-xla",
            "files": [{"filename": WHEEL, "url": f"../../files/{WHEEL}", "size": 10, "hashes": {}}]}
    FakeIndex.routes["/simple/torch-xla/"] = (200, JSON_TYPE, json.dumps(page).encode())
    files = Index(f"{index_server}/simple/").files("torch-xla")
    assert files == [IndexFile(WHEEL, f"{index_server}/files/{WHEEL}", 10)]


def test_html_page_lists_files(index_server: str) -> None:
    html = f'<html><body><a href="/files/{WHEEL}#sha256=00">{WHEEL}</a></body></html>'.encode()
    FakeIndex.routes["/simple/torch-xla/"] = (200, "text/html", html)
    assert Index(f"{index_server}/simple").files("torch-xla") == [IndexFile(WHEEL, f"{index_server}/files/{WHEEL}")]


@pytest.mark.parametrize("padding", [0, 2_000_000], ids=["central-directory-in-the-tail", "large-member-before"])
def test_metadata_is_read_with_range_requests(index_server: str, padding: int) -> None:
    wheel = serve_wheel(index_server, padding)
    index = Index(f"{index_server}/simple/")
    text = index.wheel_member(wheel, lambda name: name.endswith(".dist-info/METADATA"))
    assert text == METADATA
    assert index.wheel_member(wheel, lambda name: name == "torch_xla/version.py").startswith("__xla_gitrev__")
    assert index.wheel_member(wheel, lambda name: name == "absent") is None


@pytest.mark.parametrize("route, rule, needle", [
    ((404, "text/plain", b"no"), "index-answer", "HTTP 404"),
    ((200, JSON_TYPE, b"{not json"), "index-answer", "not JSON"),
    ((200, JSON_TYPE, b'{"files": {"a": 1}}'), "index-answer", "no `files` list"),
    ((200, JSON_TYPE, b'{"files": [{"filename": "x.whl"}]}'), "index-answer", "not a {filename, url}"),
    ((200, JSON_TYPE, b'{"files": [{"filename": "a/b.whl", "url": "x"}]}'), "index-answer", "a file named"),
    ((200, JSON_TYPE, b'{"files": [{"filename": "x.whl", "url": "x", "size": -1}]}'), "index-answer", "size"),
    ((200, "image/png", b"PNG"), "index-answer", "not a simple-API page"),
    ((200, JSON_TYPE, b'{"meta": {"api-version": "2.0"}, "files": []}'), "index-answer", "version '2.0'"),
], ids=["missing", "bad-json", "files-not-list", "file-shape", "slash-name", "negative-size", "wrong-type",
        "api-version-2"])
def test_odd_pages_are_refused_with_a_rule(index_server: str, route: tuple, rule: str, needle: str) -> None:
    FakeIndex.routes["/simple/torch-xla/"] = route
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").files("torch-xla")
    assert caught.value.rule == rule and needle in caught.value.message


def test_an_index_that_serves_no_ranges_is_refused(index_server: str) -> None:
    wheel = serve_wheel(index_server)
    FakeIndex.no_ranges = True
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").wheel_member(wheel, lambda name: True)
    assert caught.value.rule == "index-answer" and "range request" in caught.value.message


def test_a_file_that_is_not_a_zip_is_a_metadata_error(index_server: str) -> None:
    FakeIndex.routes[f"/files/{WHEEL}"] = (200, "application/octet-stream", b"<html>nope</html>" * 10)
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").wheel_member(IndexFile(WHEEL, f"{index_server}/files/{WHEEL}"), lambda name: True)
    assert caught.value.rule == "wheel-metadata" and "no zip end record" in caught.value.message


def test_an_unreachable_index_is_a_network_error_after_retries(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Failure) as caught:
        Index(f"http://127.0.0.1:{port}/simple/", attempts=2, first_wait=0.01).files("torch-xla")
    assert caught.value.rule == "index-network" and "hint" not in caught.value.message


def test_only_http_urls_are_fetched() -> None:
    with pytest.raises(Failure) as caught:
        Index("file:///etc/").files("passwd")
    assert caught.value.rule == "index-answer"
