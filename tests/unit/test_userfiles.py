"""userfiles, the one bounded reader: generated files read without following a link, logs read from their end."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from xla_images import userfiles
from xla_images.errors import ConfigError


def test_a_generated_file_is_never_read_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("FROM scratch\n")
    (tmp_path / "Dockerfile").symlink_to(tmp_path / "target")
    with pytest.raises(ConfigError) as caught:
        userfiles.read_optional(tmp_path / "Dockerfile")
    assert caught.value.rule == "file-type"
    assert userfiles.read_optional(tmp_path / "absent") is None
    assert userfiles.read_optional(tmp_path / "target") == "FROM scratch\n"


def test_a_log_tail_reads_only_the_end_of_a_huge_log(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with log.open("wb") as handle:
        handle.truncate(3 * 1024 ** 3)  # 3 GiB of holes, then the lines that matter
        handle.seek(0, os.SEEK_END)
        handle.write("".join(f"line {n}\n" for n in range(40)).encode() + b"\xff caf\xe9\n")
    assert userfiles.tail_lines(log, 3) == ["line 38", "line 39", "\ufffd caf\ufffd"]
    os.mkfifo(tmp_path / "fifo")
    assert userfiles.tail_lines(tmp_path / "fifo", 3) == [] and userfiles.tail_lines(tmp_path / "absent", 3) == []


def test_read_bytes_is_bounded_and_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    """The bounded reader for files compared byte for byte (the site's CA bundle in the credential scan)."""
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"\xef\xbb\xbf-----BEGIN CERTIFICATE-----\n")
    assert userfiles.read_bytes(bundle, limit=100) == bundle.read_bytes()  # the bytes as they are: BOM kept
    with open(bundle, "wb") as handle:
        handle.truncate(userfiles.CA_LIMIT + 1)  # sparse: nothing is read
    with pytest.raises(ConfigError) as caught:
        userfiles.read_bytes(bundle, limit=userfiles.CA_LIMIT)
    assert caught.value.rule == "file-size"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError) as caught:
        userfiles.read_bytes(tmp_path / "fifo", limit=100)
    assert caught.value.rule == "file-type"
