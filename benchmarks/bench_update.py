#!/usr/bin/env python3
"""What `build.py update` costs against the real package index: time and bytes. Prints figures, asserts nothing.

    python benchmarks/bench_update.py [--release 2.9.0 ...] [--ca-bundle /etc/ssl/certs/ca-certificates.crt]

Phases: the simple-API pages (torch-xla, torch, libtpu, torchvision, torchaudio), then per release the facts read
from one of its wheels by range requests (METADATA and torch_xla/version.py) and the companions' METADATA (newest
first, each wheel once for all releases), with the bytes each phase received against the wheel's size (what a
download would have cost).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xla_images.model import wheel_index  # noqa: E402
from xla_images.run.packages import upstream
from xla_images.run.packages.index import Index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", default=None, help="torch_xla releases to read")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--index", default=wheel_index.PUBLIC_INDEX)
    options = parser.parse_args()
    index = Index(options.index, options.ca_bundle if Path(options.ca_bundle).is_file() else None)
    started = time.perf_counter()
    files = {project: index.files(project) for project in wheel_index.PACKAGES}
    pages = time.perf_counter() - started
    print(f"simple API pages: {pages:.2f}s, {index.received / 1e3:.0f} kB for "
          + ", ".join(f"{project} {len(found)} files" for project, found in files.items()))
    memo: dict[str, str | None] = {}  # one update reads each companion wheel once
    for release in options.release or ["2.9.0", "2.8.1", "2.7.0", "2.6.0"]:
        before, started = index.received, time.perf_counter()
        facts = upstream.release_facts(index, release, files, memo=memo)
        seconds = time.perf_counter() - started
        wheel = upstream._a_wheel(files["torch-xla"], release)
        size = f"{wheel.size / 1e6:.0f} MB" if wheel.size else "unknown size"
        print(f"torch_xla {release}: {seconds:.2f}s, {(index.received - before) / 1e3:.0f} kB read of a {size} wheel;"
              f" torch {facts.torch}, libtpu {facts.libtpu}, torch_xla pythons {', '.join(facts.wheels['torch-xla'])}"
              f", libtpu pythons {', '.join(facts.wheels.get('libtpu', ())) or '-'}; companions "
              + (", ".join(f"{name} {version}" for name, version in facts.companions.items()) or "none")
              + f" ({len(memo)} companion wheels read so far)")


if __name__ == "__main__":
    main()
