#!/usr/bin/env python3
"""Cold push and cold pull of one flavour per layer compression, side by side in one run. Prints figures; asserts
nothing.

    python benchmarks/bench_pull.py [TAG] [--rounds N] [--level L] [--no-mirror] [--no-push] [--containerd-store]

TAG defaults to r2.9.0_3.11_cpu and must be built on the engine (`build.py build TAG`). Everything else is made
here and removed at the end: two registries on free 127.0.0.1 ports (ci/registry.sh, state in a temp dir), a pull
engine of its own (a second dockerd via ci/engine.sh with its own data root, bridge and socket, so it can be
restarted with and without `unpigz` while the main engine keeps working), and a pull-through cache.

Push (on the main engine, each into an emptied registry, the zstd digest cache emptied too, alternating order):
  gzip   the engine's push (what `compression: {format: gzip}` does): single-threaded gzip in dockerd
  zstd   the toolkit's push (the default): `zstd -T0` per layer, uploaded through the registry API

Pull (on the pull engine, every image and the build cache removed and the page cache dropped before each; order
alternates per round; each pulled image then runs `import torch_xla`):
  gzip, no unpigz   today's publication pulled by an engine without pigz (dockerd with MOBY_DISABLE_PIGZ=1)
  gzip, unpigz      the same layers, pigz installed (as `ci/engine.sh install` now leaves the engine)
  zstd              the default publication, same engine
  zstd via cache    through a pull-through cache (distribution's proxy mode) in front of the zstd registry:
                    first with the cache empty, then again (cold engine, warm cache); origin blob GETs counted
With --containerd-store, the pull engine is also restarted with dockerd's containerd image store and both
publications are pulled into it.
Bytes on the wire: the compressed layer sizes of the manifest pulled (what the registry sends).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.model.compression import Compression  # noqa: E402
from xla_images.model.registry import Registry  # noqa: E402
from xla_images.names import local_ref  # noqa: E402
from xla_images.run import publish, registry as registries  # noqa: E402

REPOSITORY = "xla-images-bench"
BRIDGE = "xlabench0"
BRIDGE_ADDRESS = "172.31.254.1/24"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(command: list[str], env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(command, env={**os.environ, **(env or {})}, text=True, capture_output=True)
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


class Registries:
    """Registries started with ci/registry.sh in one state folder, one port each; stopped on exit."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ports: list[int] = []

    def start(self, extra_env: dict[str, str] | None = None, command: str = "start") -> int:
        port = free_port()
        self.ports.append(port)
        self.script(command, port, extra_env)
        return port

    def script(self, command: str, port: int, extra_env: dict[str, str] | None = None) -> None:
        run(["bash", str(REPO / "ci" / "registry.sh"), command],
            {"PORT": str(port), "XLA_IMAGES_STATE": str(self.state), **(extra_env or {})})

    def log(self, port: int) -> Path:
        return self.state / "registry" / str(port) / "registry.log"

    def stop_all(self) -> None:
        for port in self.ports:
            self.script("stop", port)


class PullEngine:
    """A second dockerd (ci/engine.sh, own data root, socket and bridge) restarted with or without unpigz, with
    the classic image store (overlay2 graph driver) or containerd's (snapshotters; data root of its own)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.socket = f"unix://{state}/docker.sock"
        self.mode: tuple[bool, str] | None = None

    def env(self, store: str = "classic") -> dict[str, str]:
        config = self.state / f"daemon-{store}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"features": {"containerd-snapshotter": store == "containerd"}}))
        args = (f"--data-root {self.state}/data-{store} --exec-root {self.state}/exec --bridge {BRIDGE} "
                f"--iptables=false --ip-masq=false --config-file {config}")
        return {"XLA_IMAGES_STATE": str(self.state), "DOCKER_HOST": self.socket, "ENGINE_DOCKERD_ARGS": args,
                "ENGINE_STORAGE_DRIVER": "overlayfs" if store == "containerd" else "overlay2"}

    def use(self, pigz: bool, store: str = "classic") -> None:
        if self.mode == (pigz, store):
            return
        self.stop()
        env = self.env(store)
        if not pigz:
            env["MOBY_DISABLE_PIGZ"] = "1"
        run(["bash", str(REPO / "ci" / "engine.sh"), "start"], env)
        self.mode = (pigz, store)
        driver = self.docker("info", "--format", "{{json .DriverStatus}}").strip()
        print(f"    pull engine: {store} store ({driver}), unpigz {'on' if pigz else 'off'}", flush=True)

    def stop(self) -> None:
        if self.mode is not None:
            run(["bash", str(REPO / "ci" / "engine.sh"), "stop"], self.env(self.mode[1]))
            self.mode = None

    def docker(self, *args: str, check: bool = True) -> str:
        return run(["docker", *args], {"DOCKER_HOST": self.socket}, check)

    def empty(self) -> None:
        """Every image and the build cache gone, and the kernel's page cache dropped: a cold pull."""
        ids = self.docker("images", "-aq").split()
        if ids:
            self.docker("rmi", "-f", *sorted(set(ids)), check=False)
        self.docker("builder", "prune", "-af", check=False)
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def pull(self, ref: str) -> float:
        self.empty()
        started = time.monotonic()
        self.docker("pull", "-q", ref)
        seconds = time.monotonic() - started
        version = self.docker("run", "--rm", "--network", "none", ref, "python", "-c",
                              "import torch_xla; print(torch_xla.__version__)").strip()
        print(f"    pulled {ref.split('/')[0]} in {seconds:.1f} s; import torch_xla -> {version}", flush=True)
        return seconds


@contextlib.contextmanager
def bridge() -> Iterator[None]:
    made = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    if made:
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
    try:
        yield
    finally:
        if made:
            run(["ip", "link", "delete", BRIDGE], check=False)


def push_cold(flavour, registry: Registry, compression: Compression, registries_: Registries, port: int,
              cache: Path) -> tuple[float, int]:
    registries_.script("wipe", port)
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["XLA_IMAGES_CACHE"] = str(cache)
    client = registries.connect(registry, registries.WRITE)
    transfers: dict = {}
    started = time.monotonic()
    publish.push_flavour(flavour, registry, client, None, lambda line: None, transfers, compression)
    seconds = time.monotonic() - started
    return seconds, transfers[flavour.tag].uploaded_bytes


def wire_bytes(registry: Registry, tag: str) -> tuple[str, int]:
    client = registries.connect(registry)
    digest = client.manifest_digest(tag) or ""
    return digest, sum(int(layer["size"]) for layer in client.manifest(digest)["layers"])


def blob_gets(log: Path, since: int) -> int:
    text = log.read_bytes()[since:].decode(errors="replace")
    return len(re.findall(r'"GET /v2/[^"]*/blobs/sha256:', text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", nargs="?", default="r2.9.0_3.11_cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    parser.add_argument("--no-mirror", action="store_true", help="skip the pull-through cache case")
    parser.add_argument("--no-push", action="store_true", help="push once each, untimed (pulls only)")
    parser.add_argument("--containerd-store", action="store_true",
                        help="also pull into dockerd's containerd image store (needs containerd 1.7+)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it starts a second dockerd and drops the page cache")
    plan = load_plan(REPO / "matrix.yaml")
    flavour = next((f for f in plan.flavours if f.tag == args.tag), None)
    if flavour is None:
        raise SystemExit(f"no flavour {args.tag} in matrix.yaml")
    zstd = Compression("zstd", args.level)
    gzip = Compression("gzip", None)
    state = Path(tempfile.mkdtemp(prefix="xla-bench-pull-", dir="/var/tmp"))
    regs = Registries(state / "registries")
    engine = PullEngine(state / "engine")
    pushes: dict[str, list[float]] = {"gzip": [], "zstd": []}
    pulls: dict[str, list[float]] = {}
    try:
        ports = {"gzip": regs.start(), "zstd": regs.start()}
        where = {name: Registry.parse(f"127.0.0.1:{port}/{REPOSITORY}") for name, port in ports.items()}
        print(f"{args.tag}: {local_ref(args.tag)}; registries gzip :{ports['gzip']}, zstd :{ports['zstd']}",
              flush=True)
        push_rounds = 1 if args.no_push else args.rounds
        for round_ in range(push_rounds):
            order = [("gzip", gzip), ("zstd", zstd)]
            for name, compression in (order if round_ % 2 == 0 else order[::-1]):
                seconds, sent = push_cold(flavour, where[name], compression, regs, ports[name],
                                          state / f"cache-{name}-{round_}")
                pushes[name].append(seconds)
                print(f"  round {round_ + 1} push {name}: {seconds:.1f} s, {sent / 1e6:,.0f} MB sent", flush=True)
        sizes = {name: wire_bytes(where[name], args.tag) for name in where}
        with bridge():
            cases = [("gzip, no unpigz", False, "gzip", "classic"), ("gzip, unpigz", True, "gzip", "classic"),
                     ("zstd", True, "zstd", "classic")]
            if args.containerd_store:
                cases += [("gzip, containerd store", True, "gzip", "containerd"),
                          ("zstd, containerd store", True, "zstd", "containerd")]
            for round_ in range(args.rounds):
                for label, pigz, name, store in (cases if round_ % 2 == 0 else cases[::-1]):
                    engine.use(pigz, store)
                    print(f"  round {round_ + 1} pull {label}:", flush=True)
                    digest = sizes[name][0]
                    pulls.setdefault(label, []).append(engine.pull(f"{where[name].name}@{digest}"))
            mirror_lines = [] if args.no_mirror else mirror_case(regs, ports["zstd"], sizes["zstd"][0], engine)
        report(args.tag, pushes, pulls, sizes, mirror_lines, zstd, args.no_push)
    finally:
        engine.stop()
        regs.stop_all()
        shutil.rmtree(state, ignore_errors=True)
    return 0


def mirror_case(regs: Registries, origin_port: int, digest: str, engine: PullEngine) -> list[str]:
    """Pull through an empty cache, then again with the engine emptied: what reaches the origin each time."""
    mirror_port = regs.start({"ORIGIN": f"http://127.0.0.1:{origin_port}"}, command="start-mirror")
    origin_log = regs.log(origin_port)
    lines = []
    engine.use(True)
    for label in ("empty cache", "warm cache"):
        before = origin_log.stat().st_size
        seconds = engine.pull(f"127.0.0.1:{mirror_port}/{REPOSITORY}@{digest}")
        lines.append(f"| zstd via pull-through cache, {label} | {seconds:.1f} s | "
                     f"{blob_gets(origin_log, before)} blob GET(s) at the origin |")
    return lines


def report(tag: str, pushes: dict[str, list[float]], pulls: dict[str, list[float]],
           sizes: dict[str, tuple[str, int]], mirror_lines: list[str], zstd: Compression, no_push: bool) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"\n{tag}: layers on the wire: gzip {sizes['gzip'][1] / 1e6:,.0f} MB, "
          f"{zstd.describe()} {sizes['zstd'][1] / 1e6:,.0f} MB")
    if not no_push:
        print("\n| cold push | runs (s) | median |\n|---|---|---|")
        for name, values in pushes.items():
            print(f"| {name} | {' '.join(f'{v:.1f}' for v in values)} | {median(values):.1f} s |")
        print(f"push zstd / gzip: {median(pushes['zstd']) / median(pushes['gzip']):.2f}x")
    print("\n| cold pull (+ import torch_xla after) | runs (s) | median |\n|---|---|---|")
    for label, values in pulls.items():
        print(f"| {label} | {' '.join(f'{v:.1f}' for v in values)} | {median(values):.1f} s |")
    base, same_engine, default = (median(pulls[k]) for k in ("gzip, no unpigz", "gzip, unpigz", "zstd"))
    print(f"pull zstd / gzip without unpigz: {default / base:.2f}x; zstd / gzip with unpigz: {default / same_engine:.2f}x")
    if mirror_lines:
        print("\n| through the cache | pull | origin |\n|---|---|---|")
        print("\n".join(mirror_lines))
    print(json.dumps({"pushes": pushes, "pulls": pulls,
                      "bytes": {name: size for name, (_, size) in sizes.items()}}))


if __name__ == "__main__":
    sys.exit(main())
