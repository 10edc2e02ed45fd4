#!/usr/bin/env python3
"""Build a real flavour N times from nothing and compare every layer, file by file. Prints figures and
differences; exits 1 when a layer differs. Run as root on a machine you own the engine of: each build is a
real one (~3-5 min and ~8 GB for r2.9.0_3.11_cpu), and the flavour's images and the whole build cache are
removed before each.

    python benchmarks/bench_reproducible.py [TAG] [--builds 4] [--loaded 2,4] [--out DIR]

What it answers: do the same inputs give the same layers, also while the machine is busy (issue 35: one build
in four gave another `torch-any` layer while engine tests ran beside it). Each build is
`build.py build TAG --force --prune-cache` after the flavour's images (under every name) and the build cache are
gone, so every step runs again, the wheels from the index. The builds named by --loaded (1-based; default every
second one) run beside a load: one busy process per core and a writer filling, syncing and removing 1 GB files
in a temp dir, for the whole build.

After each build the image is read through `docker save` (the engine layer's stream, uncompressed whatever the
store): per layer its diff id and stored blob, and per file its sha256 and its tar header (type, mode, owner,
mtime, link target, PAX records, position in the tar). Each build's record is written to DIR/build-N.json
(default: a temp dir, named at the end). The report names each layer (from its `xla-images-layers/<group>.json`
manifest), prints every build's digest of it, and for a layer that differs, the files that differ and how.
`--compare DIR` reports on the records of an earlier run without building.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images import names  # noqa: E402
from xla_images.run.checking import checks
from xla_images.run import engine

MANIFEST_DIR = "xla-images-layers"
LOAD_FILE_BYTES = 1 << 30
LOAD_BUSY = "while True: pass"

# One layer's record: path -> (sha256 or "", type, mode, uid, gid, mtime, link target, PAX records, position).
Files = dict[str, list]


def remove_images(tag: str) -> None:
    """Every image of the flavour, under all its names (an alias would keep its layers stored)."""
    for image in engine.images.images_labelled({names.TAG_LABEL: tag}):
        engine.images.remove_image(image["Id"], force=True)


@contextlib.contextmanager
def load(active: bool) -> Iterator[None]:
    """A CPU and disk load for the block: one busy process per core, and one writing and syncing 1 GB files."""
    if not active:
        yield
        return
    scratch = Path(tempfile.mkdtemp(prefix="bench-reproducible-load-"))
    writer = (f"import os\nwhile True:\n    with open({str(scratch / 'fill')!r}, 'wb') as f:\n"
              f"        for _ in range({LOAD_FILE_BYTES >> 20}):\n            f.write(os.urandom(1 << 20))\n"
              f"        f.flush(); os.fsync(f.fileno())\n    os.remove({str(scratch / 'fill')!r})\n")
    processes = [subprocess.Popen([sys.executable, "-c", LOAD_BUSY]) for _ in range(os.cpu_count() or 1)]
    processes.append(subprocess.Popen([sys.executable, "-c", writer]))
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def build(tag: str, reports: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "build.py"), "build", "--force", "--prune-cache", tag,
                           "--reports", str(reports)], cwd=REPO, text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"build {tag} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.monotonic() - started


def layer_files(layer: tarfile.TarFile) -> Files:
    files: Files = {}
    for member in layer:
        digest = ""
        if member.isfile():
            handle = layer.extractfile(member)
            assert handle is not None
            sha = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                sha.update(chunk)
            digest = sha.hexdigest()
        kind = member.type.decode() if isinstance(member.type, bytes) else str(member.type)
        # The PAX records too (xattrs, sub-second times), and the entry's place: the tar's bytes depend on both.
        pax = ";".join(f"{key}={value}" for key, value in sorted(member.pax_headers.items()))
        files[member.name] = [digest, kind, member.mode, member.uid, member.gid, member.mtime, member.linkname, pax,
                              len(files)]
    return files


def layer_name(files: Files, index: int) -> str:
    """The wheel group's name from its manifest; the Dockerfile's other layers by what they hold."""
    for path in files:
        if f"/{MANIFEST_DIR}/" in path and path.endswith(".json"):
            return Path(path).stem
    if any("/xla_smoke/" in path for path in files):
        return "smoke"
    if "opt/venv/pyvenv.cfg" in files:
        return "venv"
    return "base" if index == 0 else f"layer {index}"


class _Hashing(io.RawIOBase):
    """Reads `stream` and hashes what was read: a layer's uncompressed tar, so its diff id."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.sha = stream, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[:len(data)] = data
        self.sha.update(data)
        return len(data)


def record(tag: str) -> dict:
    """Diff ids (bottom first) and every layer's files, read from the image's `docker save` stream (whose
    layers come in the store's order, not the image's: each is put in its place by its diff id)."""
    ref = names.local_ref(tag)
    diff_ids = engine.images.image_layers(ref)
    by_id: dict[str, Files] = {}
    blobs: dict[str, str] = {}  # diff id -> the first 12 hex of the stored (compressed) blob's digest
    for blob, stream in checks.saved_layers(engine.images.save_image_stream(ref)):
        hashing = _Hashing(stream)
        with tarfile.open(fileobj=io.BufferedReader(hashing, 1 << 20), mode="r|") as layer:
            files = layer_files(layer)
        while hashing.read(1 << 20):  # the tar's end blocks: the diff id hashes them too
            pass
        by_id[f"sha256:{hashing.sha.hexdigest()}"] = files
        blobs[f"sha256:{hashing.sha.hexdigest()}"] = blob
    missing = [diff_id for diff_id in diff_ids if diff_id not in by_id]
    if missing:
        raise SystemExit(f"the save stream holds no layer with diff id {', '.join(missing)}")
    return {"diff_ids": diff_ids, "blobs": [blobs[diff_id] for diff_id in diff_ids],
            "layers": [{"name": layer_name(by_id[diff_id], index), "files": by_id[diff_id]}
                       for index, diff_id in enumerate(diff_ids)]}


def differences(runs: list[dict], index: int) -> list[str]:
    """How layer `index` differs between the builds, one line per path that is not the same in all."""
    tables = [run["layers"][index]["files"] for run in runs]
    lines = []
    for path in sorted(set().union(*tables)):
        seen = [table.get(path) for table in tables]
        if all(entry == seen[0] for entry in seen):
            continue
        fields = ("sha256", "type", "mode", "uid", "gid", "mtime", "link", "pax", "position")
        if any(entry is None for entry in seen):
            what = "present in builds " + ", ".join(str(n + 1) for n, entry in enumerate(seen) if entry)
        else:
            what = "; ".join(f"{field}: " + " / ".join(str(entry[k])[:12] for entry in seen)
                             for k, field in enumerate(fields[:min(map(len, seen))])
                             if len({str(entry[k]) for entry in seen}) > 1)
        lines.append(f"    {path}: {what}")
    return lines


def report(runs: list[dict], loaded: set[int]) -> int:
    count = len(runs[0]["diff_ids"])
    if any(len(run["diff_ids"]) != count for run in runs):
        print("the builds have different numbers of layers: " + ", ".join(str(len(r["diff_ids"])) for r in runs))
        return 1
    differing = 0
    print("\nlayer            " + "".join(f"build {n + 1}{' (load)' if n + 1 in loaded else '':<9}"[:20].ljust(22)
                                        for n in range(len(runs))))
    for index in range(count):
        name = runs[0]["layers"][index]["name"]
        ids = [run["diff_ids"][index] for run in runs]
        same = len(set(ids)) == 1
        print(f"{name:<17}" + "".join(f"{digest[7:19]:<22}" for digest in ids) + ("same" if same else "DIFFERS"))
        if not same:
            differing += 1
            lines = differences(runs, index)
            print(f"  {len(lines)} path(s) differ:" if lines else "  no file differs: the tar itself does")
            print("\n".join(lines[:200]))
    print("\nfull diff ids (uncompressed), then the stored blobs' digests (compressed, first 12 hex):")
    for n, run in enumerate(runs):
        print(f"  build {n + 1}: " + " ".join(run["diff_ids"]))
    for n, run in enumerate(runs):
        print(f"  build {n + 1} blobs: " + " ".join(run["blobs"]))
    if any(run["blobs"] != runs[0]["blobs"] for run in runs):
        print("  the stored (compressed) blobs differ between builds")
        differing += 1
    print(f"\n{count - differing} of {count} layers the same in all {len(runs)} builds")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tag", nargs="?", default="r2.9.0_3.11_cpu")
    parser.add_argument("--builds", type=int, default=4)
    parser.add_argument("--loaded", default=None, help="builds (1-based, comma-separated) run beside a load "
                                                       "(default: every second one)")
    parser.add_argument("--out", type=Path, default=None, help="where each build's record goes")
    parser.add_argument("--compare", type=Path, default=None, help="report on an earlier run's records only")
    parser.add_argument("--keep", action="store_true", help="keep the last image (default: removed at the end)")
    args = parser.parse_args()
    if args.compare is not None:
        records = sorted(args.compare.glob("build-*.json"), key=lambda path: int(path.stem.split("-")[1]))
        return report([json.loads(path.read_text(encoding="utf-8")) for path in records], set())
    if args.builds < 2:
        raise SystemExit("--builds: at least 2, to compare")
    loaded = ({int(n) for n in args.loaded.split(",") if n} if args.loaded is not None
              else set(range(2, args.builds + 1, 2)))
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-reproducible-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.tag}: {args.builds} builds, beside a load: {sorted(loaded) or 'none'}; "
          f"{engine.connection.image_store()} image store; records in {out}", flush=True)
    runs = []
    try:
        for number in range(1, args.builds + 1):
            remove_images(args.tag)
            engine.builds.prune_build_cache()
            with load(number in loaded):
                seconds = build(args.tag, out / f"reports-{number}")
            runs.append(record(args.tag))
            (out / f"build-{number}.json").write_text(json.dumps(runs[-1]), encoding="utf-8")
            print(f"build {number}{' beside a load' if number in loaded else ''}: {seconds:.0f} s, "
                  f"{len(runs[-1]['diff_ids'])} layers", flush=True)
    finally:
        if not args.keep:
            remove_images(args.tag)
            engine.builds.prune_build_cache()
    return report(runs, loaded)


if __name__ == "__main__":
    sys.exit(main())
