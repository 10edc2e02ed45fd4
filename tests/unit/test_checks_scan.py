"""The layer scan of the image checks, on `docker save` streams built here (legacy and OCI layouts)."""
from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import threading
from typing import Iterator

import pytest
import zstandard

from support.registry import tar_of
from xla_images.errors import Failure
from xla_images.run.checking import checks

CA = b"-----BEGIN CERTIFICATE-----\nMIIB-proxy-ca\n-----END CERTIFICATE-----\n"


layer = tar_of  # a layer is a tar of its files


def saved_image(layers: list[bytes], oci: bool = False) -> bytes:
    config = json.dumps({"config": {}}).encode()
    members = {}
    for data in layers:
        digest = hashlib.sha256(data).hexdigest()
        members[f"blobs/sha256/{digest}" if oci else f"{digest}/layer.tar"] = data
    names = list(members)
    members["blobs/sha256/" + hashlib.sha256(config).hexdigest() if oci else "config.json"] = config
    members["manifest.json"] = json.dumps([{"Layers": names}]).encode()
    return tar_of(members)


def chunks(data: bytes, size: int = 1000) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("oci", [False, True])
def test_clean_image_has_no_findings(oci: bool) -> None:
    image = saved_image([layer({"usr/bin/python3.11": b"\x7fELF...", "etc/hostname": b"x\n"}),
                         layer({"opt/venv/lib/python3.11/site-packages/urllib_doc.py":
                                b"proxy = 'http://joe:password@proxy.example.com:3128'"})], oci)
    scan = checks.scan_saved_image(chunks(image), CA)
    assert scan.layers == 2 and scan.files == 3
    assert scan.findings == []  # library sources are not configuration: their examples are not leaks


COMPRESSORS = {"gzip": lambda data: gzip.compress(data, mtime=0),
               "zstd": lambda data: zstandard.ZstdCompressor(level=3).compress(data)}


@pytest.mark.parametrize("compression", sorted(COMPRESSORS))
def test_the_containerd_stores_compressed_blobs_are_scanned_uncompressed(compression: str) -> None:
    # The containerd image store saves its blobs as stored: each layer gzip or zstd, in an OCI layout.
    compress = COMPRESSORS[compression]
    image = saved_image([compress(layer({"etc/ok": b"x"})), compress(layer({"usr/share/renamed.pem": CA,
                                                                            "root/.netrc": b"machine m\n"}))],
                        oci=True)
    scan = checks.scan_saved_image(chunks(image), CA)
    assert scan.layers == 2 and scan.files == 3
    assert sorted((f.path, f.problem) for f in scan.findings) == [("root/.netrc", "credentials-file"),
                                                                   ("usr/share/renamed.pem", "ca-bundle")]


@pytest.mark.parametrize("oci", [False, True])
def test_ca_bundle_found_by_content_under_any_name(oci: bool) -> None:
    image = saved_image([layer({"etc/ok": b"x"}), layer({"usr/share/renamed.pem": CA})], oci)
    scan = checks.scan_saved_image(chunks(image), CA)
    assert [(f.path, f.problem) for f in scan.findings] == [("usr/share/renamed.pem", "ca-bundle")]


def test_ca_bundle_of_other_bytes_is_not_a_finding() -> None:
    image = saved_image([layer({"etc/ssl/certs/ca-certificates.crt": CA[:-2] + b"X\n"})])
    assert checks.scan_saved_image(chunks(image), CA).of("ca-bundle") == []


def test_no_ca_configured_still_scans_the_rest() -> None:
    image = saved_image([layer({"tmp/pip/pip.conf": b"[global]\n", "root/.netrc": b"machine h login a"})])
    problems = sorted(f.problem for f in checks.scan_saved_image(chunks(image), None).findings)
    assert problems == ["build-context", "credentials-file", "pip-config"]


def test_a_file_deleted_in_a_later_layer_is_still_found() -> None:
    image = saved_image([layer({"etc/pip.conf": b"[global]\ncert=/tmp/ca.crt\n"}), layer({"etc/.wh.pip.conf": b""})])
    found = checks.scan_saved_image(chunks(image), CA).findings
    assert [(f.path, f.problem) for f in found] == [("etc/pip.conf", "pip-config")]


def test_credentials_files_and_url_logins() -> None:
    image = saved_image([layer({
        "root/.docker/config.json": b'{"auths": {}}',
        "home/ci/.pypirc": b"[pypi]",
        "etc/apt/auth.conf.d/x.conf": b"url https://bob:hunter2@deb.example.com/",
    })])
    found = {(f.path, f.problem) for f in checks.scan_saved_image(chunks(image), CA).findings}
    assert found == {("root/.docker/config.json", "credentials-file"), ("home/ci/.pypirc", "credentials-file"),
                     ("etc/apt/auth.conf.d/x.conf", "url-credentials")}


# --- the scan beside the smoke suite ---------------------------------------------------------------------

def scan_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "xla-images-layer-scan"]


def test_background_scan_finds_what_the_scan_in_place_finds(tmp_path) -> None:
    image = saved_image([layer({"etc/ok": b"x"}), layer({"usr/share/renamed.pem": CA, "tmp/pip/pip.conf": b""})])
    (tmp_path / "ca.crt").write_bytes(CA)
    background = checks.BackgroundLayerScan(iter(chunks(image)), tmp_path / "ca.crt")
    assert background.result() == checks.scan_saved_image(chunks(image), CA)
    assert background.result().of("ca-bundle")  # asked twice, the same result


def test_background_scan_hands_its_failure_to_whoever_asks() -> None:
    def failing_export() -> Iterator[bytes]:
        yield saved_image([layer({"etc/ok": b"x"})])[:1024]
        raise Failure("cannot export xla-images:r9.9.9_3.11_cpu: no space left on device", rule="engine-save")

    background = checks.BackgroundLayerScan(failing_export(), None)
    with pytest.raises(Failure) as raised:
        background.result()
    assert raised.value.rule == "engine-save"


def test_stopped_background_scan_ends_and_lets_go_of_the_export() -> None:
    """An export that would never end (a member larger than any disk): stop() ends the thread and closes the
    export's stream, as on Ctrl-C during the smoke suite."""
    released = threading.Event()
    header = tarfile.TarInfo("blobs/sha256/" + "a" * 64)
    header.size = 1 << 40

    def endless_export() -> Iterator[bytes]:
        try:
            yield header.tobuf()
            while True:
                yield bytes(1 << 16)
        finally:
            released.set()

    background = checks.BackgroundLayerScan(endless_export(), None)
    assert scan_threads()
    background.stop()
    assert not scan_threads()
    assert released.is_set()


def test_metadata_scan_flags_secrets_in_labels_env_and_history() -> None:
    found = checks.scan_metadata(
        {"org.opencontainers.image.title": "xla-images r2.9.0_3.11_cpu", "ci.token": "abc"},
        ["PATH=/opt/venv/bin:/usr/bin", "PIP_INDEX_URL=https://u:p@index.example.com/simple"],
        [{"CreatedBy": "/bin/sh -c #(nop)  LABEL io.xla-images.tag=r2.9.0_3.11_cpu"},
         {"CreatedBy": "/bin/sh -c echo password=abc"}])
    assert sorted((f.where, f.problem) for f in found) == [
        ("env", "url-credentials"), ("history", "secret-word"), ("label", "secret-word")]


def test_metadata_scan_passes_real_looking_metadata() -> None:
    found = checks.scan_metadata({"io.xla-images.abi": "cxx11", "io.xla-images.tokenizer": "none"},
                                 ["PJRT_DEVICE=CPU", "XLA_IMAGES_TAG=r2.9.0_3.11_cpu"],
                                 [{"CreatedBy": "/bin/sh -c python3.11 -m venv /opt/venv"}])
    assert found == []
