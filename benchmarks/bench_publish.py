#!/usr/bin/env python3
"""Push and pull times and sizes of one built flavour image. Prints figures; asserts nothing.

    python benchmarks/bench_publish.py [TAG] [--registry HOST:PORT] [--keep-registry]

TAG defaults to r2.9.0_3.11_cpu and must be built (`build.py build TAG`). Without --registry a fresh registry is
started on a free 127.0.0.1 port (ci/registry.sh, state in a temp dir) so the first push is truly cold: no layer
is there yet and none can be mounted from another repository. Measured:

  push (cold)   `build.py push`'s work: every layer compressed and uploaded, then verified over the HTTP API
  push (warm)   the same push again: layers exist, only manifests and verification
  pull (cold)   after removing the local image (all names, and its untagged build parents), a pull by digest;
                the pulled image gets its local names back, so the image is unchanged afterwards

Sizes: the image as the engine stores it (uncompressed), and the compressed layers the registry holds.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images import names  # noqa: E402
from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.model.registry import Registry
from xla_images.run.building import build
from xla_images.run import engine
from xla_images.run import registry as registries
from xla_images.run.shipping import publish

REPOSITORY = "xla-images-bench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def registry_script(command: str, port: int, state: Path) -> None:
    subprocess.run(["bash", str(REPO / "ci" / "registry.sh"), command], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PORT": str(port), "XLA_IMAGES_STATE": str(state)})


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", nargs="?", default="r2.9.0_3.11_cpu")
    parser.add_argument("--registry", metavar="HOST:PORT", help="use this registry instead of a fresh one")
    parser.add_argument("--keep-registry", action="store_true", help="leave the fresh registry and its data")
    args = parser.parse_args()

    plan = load_plan(REPO / "matrix.yaml")
    (flavour,) = plan.select((args.tag,))
    image_id = build.built_image_id(flavour)
    if image_id is None:
        print(f"{names.local_ref(flavour.tag)} is not built from the current inputs: run ./build.py build {flavour.tag}")
        return 2
    attrs = engine.images.image_inspect(image_id) or {}
    layers = len((attrs.get("RootFS") or {}).get("Layers") or [])

    state = Path(tempfile.mkdtemp(prefix="xla-images-bench-registry-"))
    port = None
    if args.registry:
        host = args.registry
    else:
        port = free_port()
        registry_script("start", port, state)
        host = f"127.0.0.1:{port}"
    registry = Registry.parse(f"{host}/{REPOSITORY}")
    client = registries.RegistryClient(registry)
    published = state / "published.json"
    digest = None
    try:
        started = time.monotonic()
        entry = publish.push_all([flavour], registry, published)[0]
        push_cold = time.monotonic() - started
        digest = entry.digest
        manifest = client.manifest(digest)
        compressed = sum(int(layer["size"]) for layer in manifest["layers"]) + int(manifest["config"]["size"])

        started = time.monotonic()
        publish.push_all([flavour], registry, published)
        push_warm = time.monotonic() - started

        for name in flavour.aliases:
            engine.images.remove_tag(names.local_ref(name))
        engine.images.remove_image(names.local_ref(flavour.tag))
        started = time.monotonic()
        engine.transfer.pull_image(entry.ref, None)
        pull_cold = time.monotonic() - started
        for name in flavour.tags:
            engine.images.tag_image(entry.ref, names.LOCAL_REPOSITORY, name)
        engine.images.remove_tag(entry.ref)
        same = build.built_image_id(flavour) == image_id
    finally:
        if digest is not None and args.registry:
            client.delete_manifest(digest)
        if port is not None and not args.keep_registry:
            registry_script("stop", port, state)
            subprocess.run(["rm", "-rf", str(state)], check=False)

    print(f"flavour {flavour.tag}: {layers} layers, {megabytes(int(attrs.get('Size', 0)))} uncompressed, "
          f"{megabytes(compressed)} compressed in the registry ({host})")
    print(f"push (cold): {push_cold:6.1f} s  ({compressed / 1e6 / push_cold:6.1f} MB/s compressed), "
          f"{len(flavour.tags)} tags verified")
    print(f"push (warm): {push_warm:6.1f} s  (layers already there)")
    print(f"pull (cold): {pull_cold:6.1f} s  ({compressed / 1e6 / pull_cold:6.1f} MB/s compressed), "
          f"same image id after pull: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
