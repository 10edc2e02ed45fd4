"""run.packages.index against a local fake index: the simple API (JSON and HTML), METADATA by range requests, and the
answers it refuses, each with its rule. The real index is read by tests/unit/test_update_network.py."""
from __future__ import annotations

import base64
import io
import json
import struct
import time
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from support.index import FakeIndex, json_page
from rude_server import RudeServer, answer
from xla_images.errors import Failure
from xla_images.run.packages.index import JSON_TYPE, MAX_PAGE_BYTES, Index, IndexFile

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


# --- answers that must end in a named error, not a traceback or a parse of everything (issue 35) ---------------

def test_json_nested_too_deep_is_an_answer_error(index_server: str) -> None:
    FakeIndex.routes["/simple/torch-xla/"] = (200, JSON_TYPE, b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").files("torch-xla")
    assert caught.value.rule == "index-answer" and "nested too deep" in caught.value.message


def test_a_31_mb_page_is_refused_at_the_byte_bound_before_it_is_parsed(index_server: str) -> None:
    # 400,000 small entries: parsed whole, ~600 MB of objects before the file count could refuse it.
    entries = [{"filename": f"x-{number}.whl", "url": f"files/x-{number}.whl"} for number in range(400_000)]
    body = json.dumps({"meta": {"api-version": "1.0"}, "files": entries}).encode()
    assert len(body) > 20 * 1024 * 1024
    FakeIndex.routes["/simple/torch-xla/"] = (200, JSON_TYPE, body)
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").files("torch-xla")
    assert caught.value.rule == "index-answer" and f"at most {MAX_PAGE_BYTES} bytes" in caught.value.message


def test_yanked_files_are_marked_in_json_and_html(index_server: str) -> None:
    files = [{"filename": "a-1.whl", "url": "a-1.whl", "yanked": True},
             {"filename": "a-2.whl", "url": "a-2.whl", "yanked": "broken build"},
             {"filename": "a-3.whl", "url": "a-3.whl", "yanked": False}, {"filename": "a-4.whl", "url": "a-4.whl"}]
    FakeIndex.routes["/simple/a/"] = json_page(files)
    assert [file.yanked for file in Index(f"{index_server}/simple/").files("a")] == [True, True, False, False]
    html = b'<a href="a-1.whl" data-yanked="">a-1.whl</a><a href="a-2.whl" data-yanked="why">a-2.whl</a>' \
           b'<a href="a-3.whl">a-3.whl</a>'
    FakeIndex.routes["/simple/a/"] = (200, "text/html", html)
    assert [file.yanked for file in Index(f"{index_server}/simple/").files("a")] == [True, True, False]
    FakeIndex.routes["/simple/a/"] = json_page([{"filename": "a-1.whl", "url": "a-1.whl", "yanked": 1}])
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").files("a")
    assert caught.value.rule == "index-answer" and "yanked" in caught.value.message


def _patched_entry_offset(data: bytes, name: bytes, offset: int) -> bytes:
    """`data` (a zip) with the central directory entry of `name` pointing its local header at `offset`."""
    at = 0
    while True:
        at = data.index(b"PK\x01\x02", at)
        name_length = struct.unpack("<H", data[at + 28:at + 30])[0]
        if data[at + 46:at + 46 + name_length] == name:
            return data[:at + 42] + struct.pack("<I", offset) + data[at + 46:]
        at += 4


def _cut_local_header() -> bytes:
    """A wheel whose METADATA entry points at a local header signature in the last 9 bytes of the file."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("torch_xla-9.1.0.dist-info/METADATA", METADATA)
        archive.comment = b"PK\x03\x04" + b"\0" * 5
    data = buffer.getvalue()
    return _patched_entry_offset(data, b"torch_xla-9.1.0.dist-info/METADATA", len(data) - 9)


def _cut_zip64_end_record() -> bytes:
    """A zip64 end record of 10 bytes (56 are due) right before its locator and the end record."""
    body = b"\0" * 100 + b"PK\x06\x06" + b"\0" * 6
    locator = b"PK\x06\x07" + struct.pack("<IQI", 0, 100, 1)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + locator + end


@pytest.mark.parametrize("make, needle", [(_cut_local_header, "local header"),
                                          (_cut_zip64_end_record, "zip64 end record")],
                         ids=["local-header", "zip64-end-record"])
def test_a_cut_wheel_read_by_range_is_a_metadata_error(index_server: str, make, needle: str) -> None:
    FakeIndex.routes[f"/files/{WHEEL}"] = (200, "application/octet-stream", make())
    with pytest.raises(Failure) as caught:
        Index(f"{index_server}/simple/").wheel_member(IndexFile(WHEEL, f"{index_server}/files/{WHEEL}"),
                                                      lambda name: name.endswith("METADATA"))
    assert caught.value.rule == "wheel-metadata" and needle in caught.value.message


def test_a_zip64_extra_field_past_its_entry_is_a_metadata_error() -> None:
    from xla_images.run.packages.index import _entries

    name = b"torch_xla-9.1.0.dist-info/METADATA"
    extra = b"\x01\x00\x10\x00" + b"\0" * 4  # says 16 bytes of zip64 sizes, holds 4
    entry = (b"PK\x01\x02" + b"\0" * 6 + struct.pack("<H", 8) + b"\0" * 8
             + struct.pack("<IIHHH", 0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra), 0) + b"\0" * 8
             + struct.pack("<I", 0) + name + extra)
    with pytest.raises(Failure) as caught:
        list(_entries(entry, "u"))
    assert caught.value.rule == "wheel-metadata" and "extra field" in caught.value.message


# --- credentials in the index URL (issue 35) --------------------------------------------------------------------

def test_credentials_in_the_index_url_go_to_it_only_and_are_never_shown(index_server: str) -> None:
    host = index_server.removeprefix("http://")
    basic = "Basic " + base64.b64encode(b"user:s3cret").decode()
    index = Index(f"http://user:s3cret@{host}/simple/", attempts=1)
    with pytest.raises(Failure) as caught:
        index.files("torch-xla")  # 404: the error names the page
    assert FakeIndex.authorizations == [basic]
    shown = caught.value.render()
    assert "s3cret" not in shown and f"http://***@{host}/simple/torch-xla/" in shown, shown

    class OtherHost(FakeIndex):  # a redirect to another host: no Authorization goes there
        routes: dict = {}
        requests: list = []
        authorizations: list = []

    with OtherHost.host("127.0.0.2") as other:
        port = other.port
        OtherHost.routes["/simple/torch-xla/"] = json_page([{"filename": WHEEL, "url": WHEEL}])
        FakeIndex.routes["/simple/torch-xla/"] = (302, "text/plain", b"",
                                                  {"Location": f"http://127.0.0.2:{port}/simple/torch-xla/"})
        assert [file.filename for file in index.files("torch-xla")] == [WHEEL]
    assert FakeIndex.authorizations == [basic, basic] and OtherHost.authorizations == [None]


@pytest.mark.parametrize("form", ["http://127.0.0.2:{port}\\@{host}/simple/torch-xla/",
                                  "http://{host}@127.0.0.2:{port}/simple/torch-xla/",
                                  "http://127.0.0.2:{port}\t@{host}/simple/torch-xla/"],
                         ids=["backslash", "userinfo", "tab"])
def test_an_index_redirect_that_could_name_two_hosts_is_refused_before_any_request(index_server: str,
                                                                                    form: str) -> None:
    """Issue 41: requests compared a redirect's host with urlsplit and kept the index's Authorization, while
    urllib3 connected to the host before the backslash. The hop is now refused, and the other host asked nothing."""
    host = index_server.removeprefix("http://")

    class OtherHost(FakeIndex):
        routes: dict = {}
        requests: list = []
        authorizations: list = []

    with OtherHost.host("127.0.0.2") as other:
        port = other.port
        FakeIndex.routes["/simple/torch-xla/"] = (302, "text/plain", b"",
                                                  {"Location": form.format(port=port, host=host)})
        with pytest.raises(Failure) as caught:
            Index(f"http://user:s3cret@{host}/simple/", attempts=1).files("torch-xla")
        assert caught.value.rule == "url-ambiguous" and "s3cret" not in caught.value.render()
        FakeIndex.routes["/simple/torch-xla/"] = json_page([{"filename": WHEEL,
                                                             "url": form.format(port=port, host=host) + WHEEL}])
        index = Index(f"http://user:s3cret@{host}/simple/", attempts=1)
        with pytest.raises(Failure) as caught:  # a page's link of that form: refused when listed, or when read
            index.wheel_member(index.files("torch-xla")[0], lambda name: True)
        assert caught.value.rule == "url-ambiguous", caught.value.render()
    assert OtherHost.requests == [] and OtherHost.authorizations == []


# --- reads that end: the deadlines (run.netread) against a real dribbling server ---------------------------------

@pytest.fixture
def dribbling() -> Iterator[RudeServer]:
    """An index on 127.0.0.1 answering every request with a page, one byte every 0.3 s (each read alone is far
    inside requests' 60 s read timeout: only an overall deadline ends the exchange)."""
    page = json.dumps({"meta": {"api-version": "1.0"}, "files": []}).encode()
    server = RudeServer(lambda exchange: exchange.dribble(answer(200, {"Content-Type": JSON_TYPE}, page), 0.3))
    yield server
    server.close()


@pytest.mark.parametrize("limits, needle", [({"request_seconds": 1.0}, "within 1 s (the overall deadline)"),
                                            ({"command_seconds": 1.0}, "within 1 s (the deadline of all")],
                         ids=["request", "command"])
def test_an_index_dribbling_its_answer_is_cut_at_the_deadline(dribbling: RudeServer, limits: dict,
                                                              needle: str) -> None:
    index = Index(f"http://user:s3cret@{dribbling.host}/simple/", attempts=1, **limits)
    started = time.monotonic()
    with pytest.raises(Failure) as caught:
        index.files("torch-xla")
    assert time.monotonic() - started < 10
    assert caught.value.rule == "index-slow" and needle in caught.value.message
    assert dribbling.host in caught.value.message and "s3cret" not in caught.value.render()


def test_no_exchange_starts_once_the_command_deadline_passed(dribbling: RudeServer) -> None:
    index = Index(f"http://{dribbling.host}/simple/", command_seconds=5.0)
    index._started = time.monotonic() - 6
    with pytest.raises(Failure) as caught:
        index.wheel_member(IndexFile(WHEEL, f"http://{dribbling.host}/files/{WHEEL}"), lambda name: True)
    assert caught.value.rule == "index-slow" and dribbling.requests == []

