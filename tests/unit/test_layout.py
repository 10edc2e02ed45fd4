"""The host's layer-layout check (xla_images/run/packages/layout.py): wheel facts read from a wheelhouse or an index
with range requests, cached by sha256, mapped to the image's paths, and checked with layers.plan/check."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
from support.index import FakeIndex

from xla_images import layers
from xla_images.errors import Failure
from xla_images.model.lockfile import Lock, LockEntry, read_lock
from xla_images.model.site import WheelSource
from xla_images.run.packages import layout
from xla_images.run.packages.index import JSON_TYPE


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


def serve(base: str, wheels: dict[str, bytes]) -> str:
    """Put the wheels on the local index (a PEP 691 page per project, the files beside it); its simple URL."""
    projects: dict[str, list[dict]] = {}
    for filename, data in wheels.items():
        FakeIndex.routes[f"/files/{filename}"] = (200, "application/octet-stream", data)
        projects.setdefault(filename.split("-")[0], []).append({"filename": filename, "url": f"/files/{filename}"})
    for project, files in projects.items():
        FakeIndex.routes[f"/simple/{project}/"] = (200, JSON_TYPE, json.dumps({"files": files}).encode())
    return f"{base}/simple"


@pytest.fixture
def index(index_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "cache"))
    return serve(index_server, {"torch-9.0-cp311-cp311-linux_x86_64.whl": TORCH, "sympy-1.0-py3-none-any.whl": SYMPY})


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
    assert len([path for path in FakeIndex.requests if path.startswith("/files/")]) < 6, "the tail, not 3 MB"
    FakeIndex.requests.clear()
    offline = layout.WheelFinder(FakeSite(), offline=True)
    assert offline.facts(torch, source) == facts and not FakeIndex.requests, "the second check needs no network"


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
    FakeIndex.no_ranges = True
    with pytest.raises(Failure) as error:
        layout.WheelFinder(FakeSite()).facts(entry("sympy-1.0-py3-none-any.whl", SYMPY), source)
    assert error.value.rule == "index-answer" and "to a range request" in error.value.message
    with pytest.raises(Failure) as error:  # a project the index does not have: its answer, named
        layout.WheelFinder(FakeSite()).facts(entry("absent-1.0-py3-none-any.whl", b"x"), source)
    assert error.value.rule == "index-answer" and "/simple/absent/ answered HTTP 404" in error.value.message
    with pytest.raises(Failure) as error:  # a file the project's page does not list
        layout.WheelFinder(FakeSite()).facts(entry("sympy-2.0-py3-none-any.whl", b"x"), source)
    assert error.value.rule == "layout-index" and "sympy-2.0-py3-none-any.whl is on none of" in error.value.message


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


# --- verdicts cached by what they depend on ---------------------------------------------------------------

CLASH = wheel_bytes("clash", "1.0", {"torch": b"a file where torch's package directory is"})


class LockedFlavour:
    tag = "r9.0.0_3.11_cpu"
    python = "3.11"
    requirements = ("torch==9.0", "torch_xla==9.0")
    layer_requirements = requirements

    def __init__(self, source: WheelSource) -> None:
        self.wheel_source = source


def write_lock(path: Path, wheels: dict[str, bytes]) -> Path:
    lines = ["# inputs: sha256:" + "0" * 64]
    for filename, data in wheels.items():
        name, version = filename.split("-")[:2]
        lines.append(f"{name}=={version} --hash=sha256:{hashlib.sha256(data).hexdigest()}  # {filename}")
    path.write_text("\n".join(lines) + "\n")
    return path


def verdicts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / layout.VERDICTS).glob("*.json"))


def test_a_verdict_is_kept_by_its_inputs_and_reused_without_the_wheels(index: str, tmp_path: Path) -> None:
    flavour = LockedFlavour(WheelSource("test", index_url=index))
    clean = write_lock(tmp_path / "clean.lock", {"torch-9.0-cp311-cp311-linux_x86_64.whl": TORCH,
                                                 "sympy-1.0-py3-none-any.whl": SYMPY})
    first = layout.check_flavour(flavour, clean, layout.WheelFinder(FakeSite()))
    assert first.checked and first.problems == () and len(verdicts(tmp_path)) == 1
    (tmp_path / "cache" / "wheel-facts").rename(tmp_path / "facts-gone")
    FakeIndex.requests.clear()
    again = layout.check_flavour(flavour, clean, layout.WheelFinder(FakeSite(), offline=True))
    assert again == first and not FakeIndex.requests, "the kept verdict needs neither the facts nor the index"
    # Another python is another key: offline, without the facts, it is not checked (and nothing is kept).
    flavour.python = "3.12"
    assert not layout.check_flavour(flavour, clean, layout.WheelFinder(FakeSite(), offline=True)).checked
    assert len(verdicts(tmp_path)) == 1


def test_a_kept_verdict_keeps_its_problems_and_a_damaged_one_is_checked_again(index: str, tmp_path: Path) -> None:
    serve(index.removesuffix("/simple"), {"clash-1.0-py3-none-any.whl": CLASH})
    flavour = LockedFlavour(WheelSource("test", index_url=index))
    lock = write_lock(tmp_path / "clash.lock", {"torch-9.0-cp311-cp311-linux_x86_64.whl": TORCH,
                                                "sympy-1.0-py3-none-any.whl": SYMPY,
                                                "clash-1.0-py3-none-any.whl": CLASH})
    found = layout.check_flavour(flavour, lock, layout.WheelFinder(FakeSite()))
    assert found.checked and any("torch" in problem for problem in found.problems), found
    assert layout.check_flavour(flavour, lock, layout.WheelFinder(FakeSite(), offline=True)) == found
    (kept,) = verdicts(tmp_path)
    for damage in ('{"version": 1, "problems": "none"}', "not json", '{"version": 99, "problems": []}',
                   "[" * 100_000):
        kept.write_text(damage)
        assert layout.check_flavour(flavour, lock, layout.WheelFinder(FakeSite())) == found, damage
        assert json.loads(kept.read_text())["problems"] == list(found.problems)


def test_installed_companions_are_no_layer_roots(index: str, tmp_path: Path) -> None:
    """torchvision in a cpu flavour's requirements is not a third root (the libtpu group's): what no root reaches
    goes into the torch_xla layer, so the layout and its kept verdict are the ones of the layer roots."""
    plain = LockedFlavour(WheelSource("test", index_url=index))
    with_companion = LockedFlavour(WheelSource("test", index_url=index))
    with_companion.requirements = (*plain.requirements, "torchvision==1.0")
    lock = write_lock(tmp_path / "clean.lock", {"torch-9.0-cp311-cp311-linux_x86_64.whl": TORCH,
                                                "sympy-1.0-py3-none-any.whl": SYMPY})
    parsed = read_lock(lock)
    assert layout.verdict_key(with_companion, parsed) == layout.verdict_key(plain, parsed)
