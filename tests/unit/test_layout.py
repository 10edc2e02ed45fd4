"""The host's layer-layout check (xla_images/run/layout.py): wheel facts read from a wheelhouse or an index
with range requests, cached by sha256, mapped to the image's paths, and checked with layers.plan/check."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from xla_images import layers
from xla_images.errors import Failure
from xla_images.model.lockfile import Lock, LockEntry
from xla_images.model.site import WheelSource
from xla_images.run import layout


def wheel_bytes(name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = (),
                tag: str = "py3-none-any") -> bytes:
    dist_info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = ("Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {item}\n" for item in requires))).encode()
    members[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nTag: {tag}\n".encode()
    members[f"{dist_info}/RECORD"] = ("".join(f"{path},,\n" for path in members) + f"{dist_info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in members.items():
            archive.writestr(path, data)
    return buffer.getvalue()


TORCH = wheel_bytes("torch", "9.0", {"torch/__init__.py": b"", "torch-9.0.data/scripts/torchrun": b"#!python\n",
                                     "torch/lib/big.so": bytes(3 << 20)}, requires=("sympy",),
                    tag="cp311-cp311-linux_x86_64")
SYMPY = wheel_bytes("sympy", "1.0", {"sympy/__init__.py": b""})


class Index(http.server.BaseHTTPRequestHandler):
    """A simple-API index (PEP 691 JSON) whose files answer range requests, as the real index's do."""

    files: dict[str, bytes] = {}
    ranges = True
    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        type(self).requests.append(self.path)
        if self.path.startswith("/simple/"):
            project = self.path.split("/")[2]
            page = {"files": [{"filename": name, "url": f"/files/{name}",
                               "hashes": {"sha256": hashlib.sha256(data).hexdigest()}}
                              for name, data in self.files.items() if name.startswith(project)]}
            return self._send(200, json.dumps(page).encode(), "application/vnd.pypi.simple.v1+json")
        data = self.files.get(self.path.removeprefix("/files/"))
        if data is None:
            return self._send(404, b"", "text/plain")
        wanted = self.headers.get("Range", "")
        if not (self.ranges and wanted.startswith("bytes=")):
            return self._send(200, data, "application/octet-stream")
        first, _, last = wanted[6:].partition("-")
        start, end = ((max(0, len(data) - int(last)), len(data) - 1) if not first
                      else (int(first), min(int(last), len(data) - 1)))
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.wfile.write(data[start:end + 1])

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "cache"))
    Index.files = {"torch-9.0-cp311-cp311-linux_x86_64.whl": TORCH, "sympy-1.0-py3-none-any.whl": SYMPY}
    Index.ranges, Index.requests = True, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


class FakeSite:
    def ca_bundle(self) -> None:
        return None

    def wheelhouse_path(self, source: WheelSource) -> None:
        return None


def entry(filename: str, data: bytes) -> LockEntry:
    name, version = filename.split("-")[:2]
    return LockEntry(name, version, hashlib.sha256(data).hexdigest(), filename)


def test_facts_come_from_range_requests_and_then_from_the_cache(index: str) -> None:
    source = WheelSource("test", index_url=index)
    torch = entry("torch-9.0-cp311-cp311-linux_x86_64.whl", TORCH)
    facts = layout.WheelFinder(FakeSite()).facts(torch, source)
    assert facts is not None and facts.requires == ("sympy",) and facts.tags == ("cp311-cp311-linux_x86_64",)
    assert "torch-9.0.data/scripts/torchrun" in facts.record
    assert len([path for path in Index.requests if path.startswith("/files/")]) < 6, "read the tail, not 3 MB"
    Index.requests.clear()
    offline = layout.WheelFinder(FakeSite(), offline=True)
    assert offline.facts(torch, source) == facts and not Index.requests, "the second check needs no network"


def test_a_damaged_cache_entry_is_read_again(index: str, tmp_path: Path) -> None:
    source = WheelSource("test", index_url=index)
    sympy = entry("sympy-1.0-py3-none-any.whl", SYMPY)
    cached = tmp_path / "cache" / "wheel-facts" / f"{sympy.sha256}.json"
    cached.parent.mkdir(parents=True)
    cached.write_text('{"version": 1, "requires": "not a list"}')
    assert layout.WheelFinder(FakeSite(), offline=True).facts(sympy, source) is None
    assert layout.WheelFinder(FakeSite()).facts(sympy, source) is not None
    assert json.loads(cached.read_text())["record"]


def test_an_index_without_range_requests_or_without_the_wheel_is_a_clear_error(index: str) -> None:
    source = WheelSource("test", index_url=index)
    Index.ranges = False
    with pytest.raises(Failure) as error:
        layout.WheelFinder(FakeSite()).facts(entry("sympy-1.0-py3-none-any.whl", SYMPY), source)
    assert error.value.rule == "index-answer" and "to a range request" in error.value.message
    with pytest.raises(Failure) as error:
        layout.WheelFinder(FakeSite()).facts(entry("absent-1.0-py3-none-any.whl", b"x"), source)
    assert error.value.rule == "layout-index" and "absent-1.0-py3-none-any.whl is on none of" in error.value.message


def test_a_wheelhouse_file_that_is_no_zip_is_named(tmp_path: Path) -> None:
    with pytest.raises(Failure) as error:
        layout.read_wheel(io.BytesIO(b"not a zip"), "wheelhouse/x-1.0-py3-none-any.whl")
    assert error.value.rule == "layout-wheel" and "wheelhouse/x-1.0-py3-none-any.whl" in error.value.message


class Flavour:
    python = "3.11"


def test_wheel_paths_map_to_where_pip_installs_them() -> None:
    facts = {hashlib.sha256(data).hexdigest(): layout.read_wheel(io.BytesIO(data), "w") for data in (TORCH, SYMPY)}
    lock = Lock("sha256:" + "0" * 64, (entry("torch-9.0-cp311-cp311-linux_x86_64.whl", TORCH),
                                      entry("sympy-1.0-py3-none-any.whl", SYMPY)))
    dists = layout.dists_of(Flavour(), lock, facts)
    site = Path("/opt/venv/lib/python3.11/site-packages")
    assert Path("/opt/venv/bin/torchrun") in dists["torch"].files
    assert site / "torch/__init__.py" in dists["torch"].files and dists["sympy"].pure and not dists["torch"].pure
    plan = layers.plan(["torch", "torch-xla"], dists, set(dists), site)
    assert plan.groups["torch-any"] == ["sympy"] and plan.relocated == ["sympy"]
    assert layers.check(plan, {Path("/opt/venv") / path: kind for path, kind in layout.VENV_SKELETON.items()}) == []
