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


def _options(command: list[str], flag: str) -> list[str]:
    return [command[index + 1] for index, word in enumerate(command) if word == flag]


def test_a_registry_cache_imports_its_own_ref_then_its_relatives_and_exports_every_stage(tmp_path: Path) -> None:
    cache = buildkit.registry_cache("reg.lan:5000/cache", "r2.9.0_3.11_cpu",
                                    ["r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu", "r2.9.0_3.11_cpu_devel"])
    command = buildkit.BuildKitBuild(tmp_path, {}, export=Compression("zstd", 3),
                                     cache=cache).command(tmp_path / "iid", tmp_path / "meta")
    assert _options(command, "--cache-from") == [
        "type=registry,ref=reg.lan:5000/cache:r2.9.0_3.11_cpu",
        "type=registry,ref=reg.lan:5000/cache:r2.9.0_3.11_cpu_devel",
        "type=registry,ref=reg.lan:5000/cache:r2.9.0_3.11_tpuvm"]
    # The image's own compression: a cache layer is then the very blob the image pushes.
    assert _options(command, "--cache-to") == [
        "type=registry,ref=reg.lan:5000/cache:r2.9.0_3.11_cpu,mode=max,oci-mediatypes=true,compression=zstd,"
        "force-compression=true,compression-level=3"]
    assert command[-1] == str(tmp_path)  # the context stays last


def test_no_registry_cache_no_cache_options(tmp_path: Path) -> None:
    command = buildkit.BuildKitBuild(tmp_path, {}).command(tmp_path / "iid", tmp_path / "meta")
    assert not {"--cache-from", "--cache-to"} & set(command)
    loaded = buildkit.BuildKitBuild(tmp_path, {}, cache=buildkit.registry_cache("r.lan/c", "t")).command(
        tmp_path / "iid", tmp_path / "meta")
    assert _options(loaded, "--cache-to") == ["type=registry,ref=r.lan/c:t,mode=max,oci-mediatypes=true"]
