"""diskio, the one safe writer: inside its root, through no link, whole or not at all, no temporary file left."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from xla_images import diskio
from xla_images.errors import ConfigError, Failure


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.txt"
    diskio.write_text_atomic(target, "one\n", root=tmp_path, shared=True)
    diskio.write_text_atomic(target, "two\n", root=tmp_path, shared=True)
    assert target.read_text() == "two\n"
    assert sorted(path.name for path in target.parent.iterdir()) == ["b.txt"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~diskio._UMASK


def test_a_private_write_stays_private(tmp_path: Path) -> None:
    diskio.write_text_atomic(tmp_path / "record.json", "{}\n")
    assert (tmp_path / "record.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("link_at", ["folder", "file", "parent-of-root-relative"])
def test_no_write_through_a_link_under_the_root(tmp_path: Path, link_at: str) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("keep\n")
    if link_at == "folder":
        (root / "sub").symlink_to(outside)
        target = root / "sub" / "victim"
    elif link_at == "file":
        (root / "victim").symlink_to(outside / "victim")
        target = root / "victim"
    else:
        target = root / ".." / "outside" / "victim"
    with pytest.raises(ConfigError) as caught:
        diskio.write_text_atomic(target, "overwritten\n", root=root)
    assert caught.value.rule in ("disk-symlink", "disk-outside")
    assert (outside / "victim").read_text() == "keep\n"


def test_the_wrong_kind_on_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "folder").mkdir()
    for target, named in ((tmp_path / "file" / "inner", tmp_path / "file"), (tmp_path / "folder", tmp_path / "folder")):
        with pytest.raises(ConfigError) as caught:
            diskio.write_text_atomic(target, "x\n", root=tmp_path)
        assert caught.value.rule == "disk-type" and str(caught.value.location) == str(named)


def test_a_temp_name_planted_as_a_link_is_never_written_through(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "victim").write_text("keep\n")
    monkeypatch.setattr(diskio.secrets, "token_hex", lambda n: "fixed")
    (tmp_path / ".out-fixed.tmp").symlink_to(tmp_path / "victim")  # the first name tried is taken by a link
    with pytest.raises(Failure):  # every name tried is taken: refused, not written through
        diskio.write_text_atomic(tmp_path / "out", "new\n")
    assert (tmp_path / "victim").read_text() == "keep\n"
    assert not (tmp_path / "out").exists()


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "published.json"
    target.write_text("old\n")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(diskio.os, "fsync", full)
    with pytest.raises(Failure) as caught:
        diskio.write_text_atomic(target, "new\n", "published.json")
    assert caught.value.rule == "disk-write"
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["published.json"]


def test_remove_tree_refuses_a_linked_folder_and_removes_a_real_one(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("x\n")
    (root / "real" / "deep" / "link").symlink_to(outside)  # removed as a link, never followed
    (root / "linked").symlink_to(outside)
    with pytest.raises(ConfigError):
        diskio.remove_tree(root, root / "linked")
    diskio.remove_tree(root, root / "real")
    assert not (root / "real").exists() and (outside / "keep").exists()

