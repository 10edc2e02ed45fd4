"""run.engine.buildkit: what a build exports into each image store, and where the image id comes from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from xla_images.errors import Failure
from xla_images.model.compression import Compression
from xla_images.run.engine import buildkit

DIGEST = "sha256:" + "ab" * 32


def test_the_classic_store_loads_and_reads_the_iidfile(tmp_path: Path) -> None:
    command = buildkit.BuildKitBuild(tmp_path, {}).command(tmp_path / "iid", tmp_path / "meta")
    assert "--load" in command and "--output" not in command


@pytest.mark.parametrize(("export", "expected"), [
    (Compression("zstd", 3), "type=image,compression=zstd,force-compression=true,oci-mediatypes=true,"
                             "compression-level=3"),
    (Compression("zstd", 19), "type=image,compression=zstd,force-compression=true,oci-mediatypes=true,"
                              "compression-level=19"),
    (Compression("gzip", None), "type=image,compression=gzip,force-compression=true,oci-mediatypes=false"),
])
def test_the_containerd_store_gets_every_layer_in_the_sites_compression(tmp_path: Path, export: Compression,
                                                                        expected: str) -> None:
    command = buildkit.BuildKitBuild(tmp_path, {}, export=export).command(tmp_path / "iid", tmp_path / "meta")
    assert "--load" not in command
    assert command[command.index("--output") + 1] == expected


def test_the_image_id_on_the_containerd_store_is_the_manifest_digest(tmp_path: Path) -> None:
    metadata = tmp_path / "meta.json"
    metadata.write_text(json.dumps({"containerimage.config.digest": "sha256:" + "cd" * 32,
                                    "containerimage.digest": DIGEST}))
    assert buildkit._manifest_digest(metadata) == DIGEST


@pytest.mark.parametrize("text", ["", "not json", "[]", json.dumps({"containerimage.digest": "sha256:short"}),
                                  json.dumps({"containerimage.digest": 7})])
def test_a_missing_or_odd_metadata_file_gives_no_id(tmp_path: Path, text: str) -> None:
    metadata = tmp_path / "meta.json"
    if text:
        metadata.write_text(text)
    assert buildkit._manifest_digest(metadata) == ""


def test_an_image_the_containerd_store_named_is_traced_before_the_metadata_file(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    # An abort right after the export: the image exists, buildx wrote no metadata; the clean-up must know it.
    def aborted_after_naming(command, on_line, started=None):
        on_line(f"#18 naming to moby-dangling@{DIGEST} done")
        return "docker buildx exited with 130"

    monkeypatch.setattr(buildkit, "run_buildx", aborted_after_naming)
    build = buildkit.BuildKitBuild(tmp_path, {}, export=Compression("zstd", 3))
    with pytest.raises(Failure, match="exited with 130"):
        build.run(lambda line: None)
    assert build.trace.images == [DIGEST[7:19]]
