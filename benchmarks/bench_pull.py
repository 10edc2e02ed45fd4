#!/usr/bin/env python3
"""Build, cold push and cold pull of one flavour per layer compression and image store, side by side in one run.
Prints figures; asserts nothing.

    python benchmarks/bench_pull.py [TAG] [--rounds N] [--no-build] [--no-mirror] [--no-push]

TAG defaults to r2.9.0_3.11_cpu. The main engine must be the one the project installs: dockerd with the containerd
image store, whose builds store their layers as zstd (the default compression). The benchmark builds TAG there
(with --no-build it must be built already: `build.py build TAG`).
Everything else is made here and removed at the end: two registries on free 127.0.0.1 ports (ci/registry.sh,
state in a temp dir), a second engine (a dockerd via ci/engine.sh with its own data root, bridge and socket,
restarted with either image store and with or without `unpigz` while the main engine keeps working), and a
pull-through cache.

Build, then push (each build `build TAG --force --prune-cache`: every step again, wheels from the index; each push
into an emptied registry; the two pipelines alternate order per round):
  gzip   today's publication: built on the second engine with the classic image store (overlay2; its build
         compresses nothing), pushed by it (dockerd compresses every layer with gzip on one core, as `docker push`
         always did)
  zstd   the default publication: built on the main engine (containerd store; the build exports its layers as
         zstd), which pushes the blobs its build stored (no compression pass)
With --no-build the image is loaded into the classic engine instead, and only the pushes are timed.

Pull (on the second engine, every image and the build cache removed and the page cache dropped before each; order
alternates per round; each pulled image then runs `import torch_xla`):
  gzip, classic, no unpigz   today's publication pulled by the old engine (classic store, MOBY_DISABLE_PIGZ=1)
  gzip, classic, unpigz      the same, pigz installed
  zstd, classic              the default publication pulled by a classic-store engine with pigz
  gzip, containerd           today's publication pulled by the engine as the project installs it
  zstd, containerd           the default publication pulled by that engine
  zstd via cache             through a pull-through cache (distribution's proxy mode) in front of the zstd registry,
                             containerd store: first with the cache empty, then again (cold engine, warm cache);
                             origin blob GETs counted
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
from xla_images.run import engine as main_engine, registry as registries
from xla_images.run.shipping import publish
from xla_images.run.building.build import choose_base

REPOSITORY = "xla-images-bench"
BRIDGE = "xlabench0"
BRIDGE_ADDRESS = "172.31.254.1/24"
BRIDGE_SUBNET = "172.31.254.0/24"


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
        args = (f"--data-root {self.state}/data-{store} --exec-root {self.state}/exec --bridge {BRIDGE} "
                f"--iptables=false --ip-masq=false")
        return {"XLA_IMAGES_STATE": str(self.state), "DOCKER_HOST": self.socket, "ENGINE_DOCKERD_ARGS": args,
                "ENGINE_IMAGE_STORE": store}

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


# The second engine runs with --iptables=false (its rules would fight the main engine's): these let its build
# steps reach the package index, as the main engine's own rules do for docker0. Inserted first, deleted on exit.
FORWARD_RULES = ([["-t", "nat", "{}", "POSTROUTING", "-s", BRIDGE_SUBNET, "!", "-o", BRIDGE, "-j", "MASQUERADE"]]
                 + [["{}", "FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "ACCEPT"],
                    ["{}", "FORWARD", "-o", BRIDGE, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                     "-j", "ACCEPT"]])


@contextlib.contextmanager
def bridge(outbound: bool) -> Iterator[None]:
    made = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    if made:
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
    added = []
    try:
        for rule in FORWARD_RULES if outbound else []:
            run(["iptables", *[part.format("-I") for part in rule]])
            added.append(rule)
        yield
    finally:
        for rule in added:
            run(["iptables", *[part.format("-D") for part in rule]], check=False)
        if made:
            run(["ip", "link", "delete", BRIDGE], check=False)


def build(tag: str, reports: Path, docker_host: str | None = None) -> tuple[float, str]:
    """`build TAG --force --prune-cache` on the main engine, or on the one at docker_host; its time and image id."""
    env = {"DOCKER_HOST": docker_host} if docker_host else {}
    started = time.monotonic()
    run([sys.executable, str(REPO / "build.py"), "build", tag, "--force", "--prune-cache", "--reports",
         str(reports)], env)
    seconds = time.monotonic() - started
    image_id = run(["docker", "image", "inspect", "--format", "{{.Id}}", local_ref(tag)], env).strip()
    return seconds, image_id


def push_zstd(flavour, registry: Registry, registries_: Registries, port: int) -> tuple[float, int]:
    """The default publication: `push` on the main engine, which sends the zstd blobs its build stored."""
    registries_.script("wipe", port)
    client = registries.connect(registry, registries.WRITE)
    transfers: dict = {}
    started = time.monotonic()
    publish.push_flavour(flavour, registry, client, None, lambda line: None, transfers, Compression("zstd", 3))
    seconds = time.monotonic() - started
    return seconds, transfers[flavour.tag].uploaded_bytes


def push_gzip(engine: "PullEngine", image: str, registry: Registry, tag: str, registries_: Registries,
              port: int) -> tuple[float, int]:
    """Today's publication: the classic store's own push (gzip on one core) of the image it holds."""
    registries_.script("wipe", port)
    engine.use(True, "classic")
    engine.docker("tag", image, f"{registry.name}:{tag}")
    started = time.monotonic()
    engine.docker("push", "-q", f"{registry.name}:{tag}")
    seconds = time.monotonic() - started
    engine.docker("rmi", f"{registry.name}:{tag}")
    return seconds, wire_bytes(registry, tag)[1]


def load_into_classic(engine: "PullEngine", image: str) -> None:
    """`docker save` on the main engine into `docker load` on the classic one: the image the gzip push sends, or
    the base its build starts from (Docker Hub is out of reach)."""
    engine.use(True, "classic")
    started = time.monotonic()
    saver = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    loaded = subprocess.run(["docker", "load", "-q"], stdin=saver.stdout, capture_output=True, text=True,
                            env={**os.environ, "DOCKER_HOST": engine.socket})
    saver.stdout.close()
    if saver.wait() != 0 or loaded.returncode != 0:
        raise SystemExit(f"loading {image} into the classic engine failed: {loaded.stderr.strip()}")
    print(f"  loaded {image} into the classic engine in {time.monotonic() - started:.0f} s", flush=True)


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
    parser.add_argument("--no-build", action="store_true",
                        help="time no build: load the main engine's image into the classic engine instead")
    parser.add_argument("--no-mirror", action="store_true", help="skip the pull-through cache case")
    parser.add_argument("--no-push", action="store_true", help="push once each (pulls only: the push is untimed)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it starts a second dockerd and drops the page cache")
    plan = load_plan(REPO / "matrix.yaml")
    flavour = next((f for f in plan.flavours if f.tag == args.tag), None)
    if flavour is None:
        raise SystemExit(f"no flavour {args.tag} in matrix.yaml")
    if main_engine.connection.image_store() != "containerd":
        raise SystemExit("the main engine must be the project's (ci/engine.sh start: containerd image store)")
    timed_builds = not (args.no_build or args.no_push)
    state = Path(tempfile.mkdtemp(prefix="xla-bench-pull-", dir="/var/tmp"))
    regs = Registries(state / "registries")
    engine = PullEngine(state / "engine")
    builds: dict[str, list[float]] = {"gzip": [], "zstd": []}
    pushes: dict[str, list[float]] = {"gzip": [], "zstd": []}
    pulls: dict[str, list[float]] = {}
    try:
        ports = {"gzip": regs.start(), "zstd": regs.start()}
        where = {name: Registry.parse(f"127.0.0.1:{port}/{REPOSITORY}") for name, port in ports.items()}
        print(f"{args.tag}: {local_ref(args.tag)}; registries gzip :{ports['gzip']}, zstd :{ports['zstd']}",
              flush=True)
        with bridge(outbound=timed_builds):
            load_into_classic(engine, choose_base(flavour.python, flavour.base_image) if timed_builds
                              else local_ref(args.tag))
            push_rounds = 1 if args.no_push else args.rounds
            for round_ in range(push_rounds):
                order = ["gzip", "zstd"]
                for name in (order if round_ % 2 == 0 else order[::-1]):
                    if timed_builds:
                        engine.use(True, "classic")
                        seconds, image_id = build(args.tag, state / "reports",
                                                  engine.socket if name == "gzip" else None)
                        builds[name].append(seconds)
                        store = "classic" if name == "gzip" else "containerd"
                        print(f"  round {round_ + 1} build, {store} store: {seconds:.1f} s ({image_id[7:19]})",
                              flush=True)
                    if name == "gzip":
                        seconds, sent = push_gzip(engine, local_ref(args.tag), where[name], args.tag, regs,
                                                  ports[name])
                    else:
                        seconds, sent = push_zstd(flavour, where[name], regs, ports[name])
                    pushes[name].append(seconds)
                    print(f"  round {round_ + 1} push {name}: {seconds:.1f} s, {sent / 1e6:,.0f} MB", flush=True)
            sizes = {name: wire_bytes(where[name], args.tag) for name in where}
            cases = [("gzip, classic, no unpigz", False, "gzip", "classic"),
                     ("gzip, classic, unpigz", True, "gzip", "classic"),
                     ("zstd, classic", True, "zstd", "classic"),
                     ("gzip, containerd", True, "gzip", "containerd"),
                     ("zstd, containerd", True, "zstd", "containerd")]
            for round_ in range(args.rounds):
                for label, pigz, name, store in (cases if round_ % 2 == 0 else cases[::-1]):
                    engine.use(pigz, store)
                    print(f"  round {round_ + 1} pull {label}:", flush=True)
                    digest = sizes[name][0]
                    pulls.setdefault(label, []).append(engine.pull(f"{where[name].name}@{digest}"))
            mirror_lines = [] if args.no_mirror else mirror_case(regs, ports["zstd"], sizes["zstd"][0], engine)
        report(args.tag, builds, pushes, pulls, sizes, mirror_lines, args.no_push)
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
    engine.use(True, "containerd")
    for label in ("empty cache", "warm cache"):
        before = origin_log.stat().st_size
        seconds = engine.pull(f"127.0.0.1:{mirror_port}/{REPOSITORY}@{digest}")
        lines.append(f"| zstd via pull-through cache, {label} | {seconds:.1f} s | "
                     f"{blob_gets(origin_log, before)} blob GET(s) at the origin |")
    return lines


def report(tag: str, builds: dict[str, list[float]], pushes: dict[str, list[float]],
           pulls: dict[str, list[float]], sizes: dict[str, tuple[str, int]], mirror_lines: list[str],
           no_push: bool) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"\n{tag}: layers on the wire: gzip {sizes['gzip'][1] / 1e6:,.0f} MB, zstd {sizes['zstd'][1] / 1e6:,.0f} MB")
    if builds["gzip"]:
        print("\n| build, then push | build runs (s) | push runs (s) | median build + median push |\n|---|---|---|---|")
        for name, label in (("gzip", "classic store, gzip (today's)"), ("zstd", "containerd store, zstd")):
            print(f"| {label} | {' '.join(f'{v:.1f}' for v in builds[name])} | "
                  f"{' '.join(f'{v:.1f}' for v in pushes[name])} | "
                  f"{median(builds[name]):.1f} + {median(pushes[name]):.1f} = "
                  f"{median(builds[name]) + median(pushes[name]):.1f} s |")
        ratio = (median(builds["zstd"]) + median(pushes["zstd"])) / (median(builds["gzip"]) + median(pushes["gzip"]))
        print(f"build + push, zstd on the containerd store / gzip on the classic store: {ratio:.2f}x; "
              f"the build alone: {median(builds['zstd']) / median(builds['gzip']):.2f}x")
    if not no_push:
        print("\n| cold push | runs (s) | median |\n|---|---|---|")
        for name, values in pushes.items():
            print(f"| {name} | {' '.join(f'{v:.1f}' for v in values)} | {median(values):.1f} s |")
        ratio = median(pushes["zstd"]) / median(pushes["gzip"])
        print(f"push zstd (stored blobs) / gzip (classic store): {ratio:.2f}x")
    print("\n| cold pull (+ import torch_xla after) | runs (s) | median |\n|---|---|---|")
    for label, values in pulls.items():
        print(f"| {label} | {' '.join(f'{v:.1f}' for v in values)} | {median(values):.1f} s |")
    old, same_engine, default = (median(pulls[k]) for k in ("gzip, classic, no unpigz", "gzip, containerd",
                                                            "zstd, containerd"))
    print(f"pull zstd / gzip by the old engine: {default / old:.2f}x; "
          f"zstd / gzip by the project's engine: {default / same_engine:.2f}x")
    if mirror_lines:
        print("\n| through the cache | pull | origin |\n|---|---|---|")
        print("\n".join(mirror_lines))
    print(json.dumps({"builds": builds, "pushes": pushes, "pulls": pulls,
                      "bytes": {name: size for name, (_, size) in sizes.items()}}))


if __name__ == "__main__":
    sys.exit(main())
