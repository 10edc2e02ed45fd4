#!/usr/bin/env python3
"""Promotion and pruning figures on real registries. Prints figures; asserts nothing.

    python benchmarks/bench_lifecycle.py [--megabytes 512] [--layers 4] [--chunk-mb 16]

Two docker-registry processes are started through ci/registry.sh on free ports of 127.0.0.1:5030-5039 (state in
a temp dir, removed afterwards). An image of `--layers` incompressible layers totalling `--megabytes` is written
straight over the HTTP API into the first, then measured:

  promote (stream)  registry to registry, every blob GET from the source and PATCH/PUT to the destination
  promote (again)   the same promotion: every blob already there, only manifests and verification
  promote (mount)   to another repository of the same registry: cross-repository mounts, no bytes moved
  prune + gc        the moving tag moved on to a 1 MB image, the streamed copy's dated tag deleted, then garbage-collect --delete-untagged with the
                    registry stopped: blobs and bytes on disk before and after, seconds (stop + gc + start)
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images.model.flavour import Abi, Accelerator, Channel  # noqa: E402
from xla_images.model.registry import Registry  # noqa: E402
from xla_images.model.site import WheelSource  # noqa: E402
from xla_images.model.target import Target  # noqa: E402
from xla_images.run.shipping import promote, prune
from xla_images.run.registry import RegistryClient

SCRIPT = REPO / "ci" / "registry.sh"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
NIGHT = "20200101"


def free_port(taken: set[int]) -> int:
    for port in range(5030, 5040):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in taken:
            return port
    raise SystemExit("no free port in 5030-5039")


def registry_script(command: str, state: Path, port: int) -> None:
    subprocess.run(["bash", str(SCRIPT), command], check=True, capture_output=True,
                   env={**os.environ, "PORT": str(port), "XLA_IMAGES_STATE": str(state)})


def upload(url: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    location = requests.post(f"{url}/v2/{repo}/blobs/uploads/", timeout=30).headers["Location"]
    location = url + location if location.startswith("/") else location
    requests.put(location, params={"digest": digest}, data=data, timeout=600).raise_for_status()
    return digest


def write_image(url: str, repo: str, tags: list[str], megabytes: int, layers: int) -> int:
    """An image of `layers` random layers; returns the bytes of its blobs."""
    diff_ids, described, total = [], [], 0
    for index in range(layers):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as archive:
            payload = os.urandom((megabytes << 20) // layers)
            info = tarfile.TarInfo(f"layer{index}.bin")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
        tar = raw.getvalue()
        blob = gzip.compress(tar, compresslevel=1, mtime=0)
        diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
        described.append({"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(blob),
                          "digest": upload(url, repo, blob)})
        total += len(blob)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_V2, "layers": described, "config": {
        "mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
        "digest": upload(url, repo, config)}}).encode()
    for tag in tags:
        requests.put(f"{url}/v2/{repo}/manifests/{tag}", data=manifest, headers={"Content-Type": MANIFEST_V2},
                     timeout=30).raise_for_status()
    return total + len(config)


def nightly_flavour() -> Target:
    flavour = Target(torch_xla="9.0.0", torch="9.0.0", python="3.11", abi=Abi.CXX11, accelerator=Accelerator.CPU,
                      libtpu=None, release_default_abi=Abi.CXX11, pytorch_git_rev="nightly", xla_git_rev="master",
                      wheel_source=WheelSource("bench"), base_image="bench", declared_at="bench",
                      channel=Channel.NIGHTLY, nightly_base="9.0.0")
    return flavour.with_nightly(torch=f"9.0.0.dev{NIGHT}", torch_xla=f"9.0.0.dev{NIGHT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--chunk-mb", type=int, default=promote.DEFAULT_CHUNK >> 20)
    args = parser.parse_args()
    flavour = nightly_flavour()
    with tempfile.TemporaryDirectory(prefix="xla-images-bench-lifecycle-") as scratch:
        state = Path(scratch)
        ports = [free_port(set())]
        ports.append(free_port(set(ports)))
        for port in ports:
            registry_script("start", state / str(port), port)
        try:
            run(flavour, state, ports, args)
        finally:
            for port in ports:
                registry_script("stop", state / str(port), port)


def run(flavour: Target, state: Path, ports: list[int], args: argparse.Namespace) -> None:
    staging, production = (f"127.0.0.1:{port}" for port in ports)
    size = write_image(f"http://{staging}", "stage", list(flavour.tags), args.megabytes, args.layers)
    print(f"image: {args.layers} layers, {size / 1e6:.1f} MB of blobs, tags {', '.join(flavour.tags)}")
    source = RegistryClient(Registry.parse(f"{staging}/stage"))
    published = state / "published.json"
    for label, target in (("promote (stream)", f"{production}/prod"), ("promote (again)", f"{production}/prod"),
                          ("promote (mount)", f"{staging}/prod")):
        started = time.monotonic()
        (done,) = promote.promote([flavour], source, RegistryClient(Registry.parse(target)), published,
                                  chunk_size=args.chunk_mb << 20)
        seconds = time.monotonic() - started
        rate = done.transfer.bytes_copied / seconds / 1e6 if seconds else 0.0
        print(f"{label:17} {seconds:6.2f} s  {done.transfer}  ({rate:.0f} MB/s streamed)")
    published.unlink()  # nothing protected: the streamed copy may go
    client = RegistryClient(Registry.parse(f"{production}/prod"))
    today = datetime.datetime.strptime(NIGHT, "%Y%m%d").date() + datetime.timedelta(days=30)
    # The next night moves the moving tag on (a 1 MB image here): the dated tag is the copy's only name left.
    write_image(f"http://{production}", "prod", [flavour.tag], 1, 1)
    started = time.monotonic()
    report = prune.prune(client, keep=0, older_than_days=7, protected={}, state=state / str(ports[1]), today=today)
    seconds = time.monotonic() - started
    gc = report.collected
    if gc is None:
        print(f"prune + gc: collection skipped ({report.gc_skipped})")
        return
    print(f"prune + gc        {seconds:6.2f} s  deleted {len(report.deleted)} manifest(s); blobs "
          f"{gc.before.blobs} -> {gc.after.blobs}, {gc.before.bytes / 1e6:.1f} -> {gc.after.bytes / 1e6:.1f} MB "
          f"({gc.freed / 1e6:.1f} MB freed)")


if __name__ == "__main__":
    main()
