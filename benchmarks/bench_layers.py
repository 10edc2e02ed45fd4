#!/usr/bin/env python3
"""Layer sharing, reproducibility and transfer of real flavours. Prints figures; asserts nothing.

    python benchmarks/bench_layers.py [--steps build,push,bake,single,pull,py313] [--port 5010]
                                      [--wheelhouse DIR] [--keep] [--prune-cache]

Builds (through BuildKit) r2.9.0_3.11_cpu and r2.9.0_3.11_tpuvm under a local repository of its own
(XLA_IMAGES_LOCAL_REPOSITORY, default xla-images-bench-layers), starts a registry of its own on --port (state in
a temp dir; the single-layer image goes to a second one on --port + 1) and measures:

  build     build time of each flavour; bytes (uncompressed, per layer) the cpu and tpu images share
  push      push time of the cpu flavour (cold registry), then of the tpu flavour (goal <= 0.2x); bytes
            uploaded vs already present; registry storage vs the sum of the images' compressed sizes
  bake      the cpu flavour again through `docker buildx bake` on the generated docker-bake.json, with
            --no-cache (every step re-run, nothing from the build cache): share of layer digests equal (goal 100%)
  single    the runtime stage of the cpu flavour built again in both layouts from the same cached wheels stage
            (layered, and single-layer: one COPY of every group); the single-layer image pushed (compare: the push
            step's cold push of the layered one)
  pull      cold pull of the layered cpu image (neither flavour local) and of the single-layer one; then the tpu
            flavour after the cpu one (only its own layers are fetched)
  py313     r2.9.0_3.13_cpu (base bootstrapped from trixie if absent): layers shared with 3.11, storage of
            all pushed flavours vs the sum of their sizes (goal <= 0.5)
Images, the registry and its data are removed at the end unless --keep.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_IMAGES_LOCAL_REPOSITORY", "xla-images-bench-layers")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xla_images import names  # noqa: E402
from xla_images.generate import cigen
from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.model.registry import Registry
from xla_images.run.building import bake as baking, build, context as build_context
from xla_images.run import engine
from xla_images.run import registry as registries
from xla_images.run.shipping import publish

CPU, TPU, CPU313 = "r2.9.0_3.11_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.13_cpu"
SINGLE_REPOSITORY = "xla-images-bench-single"


def say(text: str) -> None:
    print(text, flush=True)


class Log:
    """Reporter: build output to a file, states to stdout once per step."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("a", encoding="utf-8")

    def state(self, flavour, text: str) -> None:
        pass

    def line(self, flavour, text: str) -> None:
        self.handle.write(f"{flavour.tag} {text}\n")
        if text.startswith("layer "):
            say(f"  {flavour.tag}: {text}")

    def finished(self, result) -> None:
        say(f"  {result.flavour.tag}: {result.outcome.value} in {result.seconds:.0f} s {result.message}")

    def notice(self, text: str) -> None:
        say(text)


def start_registry(port: int, state: Path) -> dict[str, str]:
    env = {**os.environ, "PORT": str(port), "XLA_IMAGES_STATE": str(state)}
    subprocess.run(["bash", str(REPO / "ci" / "registry.sh"), "start"], env=env, check=True, capture_output=True)
    return env


def stop_registry(env: dict[str, str], state: Path) -> None:
    subprocess.run(["bash", str(REPO / "ci" / "registry.sh"), "stop"], env=env, capture_output=True)
    shutil.rmtree(state, ignore_errors=True)


def registry_bytes(state: Path, port: int) -> int:
    data = state / "registry" / str(port) / "data"
    return sum(path.stat().st_size for path in data.rglob("*") if path.is_file())


def manifest_bytes(client: registries.RegistryClient, tag: str) -> int:
    manifest = client.manifest(tag)
    return sum(int(blob["size"]) for blob in manifest["layers"]) + int(manifest["config"]["size"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="build,push,bake,single,pull,py313")
    parser.add_argument("--port", type=int, default=5010)
    parser.add_argument("--wheelhouse", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--prune-cache", action="store_true",
                        help="prune the engine's unreferenced build cache and reap orphaned overlay2 directories "
                             "(ci/engine.sh reap: the engine must be the one ci/engine.sh started) between steps; "
                             "one flavour's wheels stage holds ~15 GB of cache")
    args = parser.parse_args()
    steps = set(args.steps.split(","))
    plan = load_plan(REPO / "matrix.yaml")
    flavours = {flavour.tag: flavour for flavour in plan.flavours}
    work = Path(tempfile.mkdtemp(prefix="bench-layers-"))
    log = Log(work / "build.log")
    options = build.BuildOptions(wheelhouse=args.wheelhouse, reports_dir=work / "reports")
    say(f"engine {engine.connection.engine_version()}, buildx {engine.buildkit.buildx_info().version} "
        f"({engine.buildkit.buildx_info().driver} driver); BuildKit: {engine.buildkit.use_buildkit()}; logs in {work}")
    registry = Registry.parse(f"127.0.0.1:{args.port}/xla-images-bench")
    env = start_registry(args.port, work / "state")
    client = registries.RegistryClient(registry)
    pushed: list[str] = []
    single_port = args.port + 1  # the single-layer image goes to a registry of its own: storage stays comparable
    single_env: dict[str, str] | None = None

    def prune_cache() -> None:
        """The build cache, and the overlay2 copies dockerd orphans when a build exports a layer it already
        holds (ci/engine.sh explains; without the reap, every shared layer costs its size again on disk)."""
        if args.prune_cache:
            subprocess.run(["docker", "builder", "prune", "--all", "--force"], check=True, capture_output=True)
            reaped = subprocess.run(["bash", str(REPO / "ci" / "engine.sh"), "reap"], capture_output=True, text=True)
            say(f"  ({(reaped.stdout + reaped.stderr).strip().splitlines()[-1]})")
    local = {tag: names.local_ref(flavours[tag].tag) for tag in (CPU, TPU, CPU313)}
    try:
        if "build" in steps:
            for tag in (CPU, TPU):
                results = build.build_flavours(plan, [flavours[tag]], options, log)
                if results[0].outcome not in (build.Outcome.BUILT, build.Outcome.SKIPPED):
                    say(f"build of {tag} failed: {results[0].message}")
                    return 1
                if "bake" in steps or tag == CPU:  # bake (no cache) and the tpu build make their own
                    prune_cache()
            check = engine.containers.run_container(local[CPU], ["python", "-c", "import torch, torch_xla; print("
                                                      "torch.__version__, torch_xla.__version__)"], role="bench")
            say(f"import check in {CPU}: exit {check.exit_code}: {check.output.strip()[-200:]}")
            cpu, tpu = engine.images.image_layers(local[CPU]), engine.images.image_layers(local[TPU])
            say(f"cpu/tpu layers: {len(cpu)} / {len(tpu)}, shared {sum(1 for layer in tpu if layer in cpu)} "
                f"(diff ids; the split's per-group sizes are in the build log lines above)")
        if "push" in steps:
            transfers: dict[str, publish.Transfer] = {}
            seconds = {}
            for tag in (CPU, TPU):
                started = time.monotonic()
                publish.push_flavour(flavours[tag], registry, client, None, lambda line: None, transfers)
                seconds[tag] = time.monotonic() - started
                pushed.append(tag)
                say(f"push {tag}: {seconds[tag]:.1f} s, {transfers[tag].describe()}")
            say(f"push time second/first: {seconds[TPU] / seconds[CPU]:.3f}x (goal <= 0.2x)")
            blobs = {tag: {blob["digest"]: int(blob["size"]) for blob in client.manifest(tag)["layers"]}
                     for tag in (CPU, TPU)}
            shared = sum(size for digest, size in blobs[TPU].items() if digest in blobs[CPU])
            say(f"compressed bytes shared by cpu and tpu: {shared / 1e9:.2f} GB of tpu's "
                f"{sum(blobs[TPU].values()) / 1e9:.2f} GB ({100 * shared / sum(blobs[TPU].values()):.1f}%); "
                f"tpu only: {(sum(blobs[TPU].values()) - shared) / 1e6:.0f} MB")
            stored = registry_bytes(work / "state", args.port)
            total = sum(manifest_bytes(client, tag) for tag in pushed)
            say(f"registry storage {stored / 1e9:.2f} GB for {len(pushed)} flavours whose images sum to "
                f"{total / 1e9:.2f} GB compressed: ratio {stored / total:.2f}")
        if "bake" in steps:
            if "build" not in steps:  # bake alone: the cpu flavour built by build.py first, to compare with
                (result,) = build.build_flavours(plan, [flavours[CPU]], options, log)
                if result.outcome not in (build.Outcome.BUILT, build.Outcome.SKIPPED):
                    say(f"build of {CPU} failed: {result.message}")
                    return 1
            contexts = work / "bake"
            override = baking.assemble_bake_contexts(plan, [flavours[CPU]], contexts)
            target = cigen.bake_target_name(flavours[CPU])
            bake_ref = f"xla-images-bench-bake:{CPU}"
            started = time.monotonic()
            engine.buildkit.bake([REPO / cigen.BAKE_FILE, override], [target],
                                 lambda line: log.handle.write(line + "\n"), no_cache=True,
                        overrides=[f"{target}.tags={bake_ref}"])
            say(f"bake --no-cache of {CPU}: {time.monotonic() - started:.0f} s")
            before, after = engine.images.image_layers(local[CPU]), engine.images.image_layers(bake_ref)
            equal = sum(1 for old, new in zip(before, after) if old == new)
            say(f"rebuild digest equality: {equal}/{len(before)} layers equal "
                f"({100 * equal / len(before):.0f}%, goal 100%), layer counts {len(before)}/{len(after)}")
            engine.images.remove_tag(bake_ref)
        if "single" in steps:
            # Side by side in one run: the runtime stage of each layout built from the same cached wheels stage
            # (--no-cache-filter runtime); the single-layer image pushed, and pulled cold in the pull step. The
            # flavour images go first (they are pushed; the pull step fetches them cold anyway): a runtime stage
            # exported beside an identical image would orphan its layers' snapshots.
            for tag in (CPU, TPU):
                remove_flavour_image(flavours[tag])
            prune_cache()
            started = time.monotonic()
            runtime_image(plan, flavours[CPU], work / "warm", None, args.wheelhouse, log, single_layer=False)
            say(f"wheels stage of {CPU} (untimed warm-up for the two layouts): {time.monotonic() - started:.0f} s")
            single_ref = f"{SINGLE_REPOSITORY}:{CPU}"
            layered_ref = f"{SINGLE_REPOSITORY}-layered:{CPU}"
            for layout, ref in (("layered", layered_ref), ("single-layer", single_ref)):
                started = time.monotonic()
                runtime_image(plan, flavours[CPU], work / layout, ref, args.wheelhouse, log,
                              single_layer=layout == "single-layer")
                say(f"{layout} build of {CPU}, runtime stage (wheels stage from cache): "
                    f"{time.monotonic() - started:.0f} s, {len(engine.images.image_layers(ref))} layers")
            # The layered layout's cold push is the push step's first one (an empty registry); the single layer
            # goes to an empty registry of its own.
            single_env = start_registry(single_port, work / "single-state")
            cold = Registry.parse(f"127.0.0.1:{single_port}/xla-images-bench-single-layer")
            engine.images.tag_image(single_ref, cold.name, CPU)
            started = time.monotonic()
            engine.transfer.push_image(cold.name, CPU, None)
            say(f"single-layer push (cold registry): {time.monotonic() - started:.1f} s")
            engine.images.remove_tag(cold.ref(CPU))
            for ref in (layered_ref, single_ref):
                image_id = engine.images.image_inspect(ref)["Id"]
                engine.images.remove_tag(ref)
                engine.images.remove_image(image_id, force=True)
            prune_cache()
        if "pull" in steps and CPU in pushed:
            # Cold: neither flavour of the release is local, so every layer but the base comes over the wire.
            for tag in (CPU, TPU):
                remove_flavour_image(flavours[tag])
            for layout in ("layered", "single-layer"):
                if "single" not in steps and layout == "single-layer":
                    continue
                ref = (registry.ref(CPU) if layout == "layered" else
                       Registry.parse(f"127.0.0.1:{single_port}/xla-images-bench-{layout}").ref(CPU))
                started = time.monotonic()
                engine.transfer.pull_image(ref, None)
                say(f"{layout} pull of {CPU}, cold: {time.monotonic() - started:.1f} s")
                image_id = engine.images.image_inspect(ref)["Id"]
                if layout == "layered":
                    engine.images.tag_image(ref, names.LOCAL_REPOSITORY, CPU)
                engine.images.remove_tag(ref)
                if layout != "layered":
                    engine.images.remove_image(image_id, force=True)
            if TPU in pushed:
                started = time.monotonic()
                engine.transfer.pull_image(registry.ref(TPU), None)
                say(f"layered pull of {TPU} after {CPU} (only what the tpu flavour adds is fetched): "
                    f"{time.monotonic() - started:.1f} s")
                engine.images.tag_image(registry.ref(TPU), names.LOCAL_REPOSITORY, TPU)
                engine.images.remove_tag(registry.ref(TPU))
        if single_env is not None:
            stop_registry(single_env, work / "single-state")
            single_env = None
        if "py313" in steps:
            prune_cache()
            from xla_images.run.building import base as bases

            if bases.find_base("3.13") is None:
                started = time.monotonic()
                bases.ensure_base("3.13", say=lambda line: None)
                say(f"bootstrapped the python 3.13 base in {time.monotonic() - started:.0f} s")
            results = build.build_flavours(plan, [flavours[CPU313]], options, log)
            if results[0].outcome in (build.Outcome.BUILT, build.Outcome.SKIPPED):
                c311, c313 = engine.images.image_layers(local[CPU]), engine.images.image_layers(local[CPU313])
                say(f"3.13 cpu shares {sum(1 for layer in c313 if layer in c311)} of {len(c313)} layers with 3.11 cpu")
                transfers = {}
                started = time.monotonic()
                publish.push_flavour(flavours[CPU313], registry, client, None, lambda line: None, transfers)
                pushed.append(CPU313)
                say(f"push {CPU313}: {time.monotonic() - started:.1f} s, {transfers[CPU313].describe()}")
                blobs = {tag: {blob["digest"]: int(blob["size"]) for blob in client.manifest(tag)["layers"]}
                         for tag in (CPU, CPU313)}
                shared = sum(size for digest, size in blobs[CPU313].items() if digest in blobs[CPU])
                say(f"compressed bytes {CPU313} shares with {CPU}: {shared / 1e9:.2f} GB of "
                    f"{sum(blobs[CPU313].values()) / 1e9:.2f} GB ({100 * shared / sum(blobs[CPU313].values()):.1f}%)")
                stored = registry_bytes(work / "state", args.port)
                total = sum(manifest_bytes(client, tag) for tag in pushed)
                say(f"registry storage {stored / 1e9:.2f} GB for {len(pushed)} flavours ({', '.join(pushed)}) "
                    f"whose images sum to {total / 1e9:.2f} GB compressed: ratio {stored / total:.2f} (goal <= 0.5)")
            else:
                say(f"build of {CPU313} failed: {results[0].message}")
    finally:
        if not args.keep:
            stop_registry(env, work / "state")
            if single_env is not None:
                stop_registry(single_env, work / "single-state")
            for tag, ref in local.items():
                flavour = flavours[tag]
                attrs = engine.images.image_inspect(ref)
                for name in flavour.tags:
                    engine.images.remove_tag(names.local_ref(name))
                if attrs is not None:
                    engine.images.remove_image(attrs["Id"], force=True)
            shutil.rmtree(work / "bake", ignore_errors=True)
    return 0


def remove_flavour_image(flavour) -> None:
    attrs = engine.images.image_inspect(names.local_ref(flavour.tag))
    for name in flavour.tags:
        engine.images.remove_tag(names.local_ref(name))
    if attrs is not None:
        engine.images.remove_image(attrs["Id"], force=True)


def runtime_image(plan, flavour, context: Path, ref: str | None, wheelhouse: Path | None, log: Log, *,
                  single_layer: bool) -> None:
    """The flavour's runtime stage built again on the cached wheels stage; optionally with every group in one
    COPY (the single-layer layout), for comparison. `ref` None: only the wheels stage, into the cache."""
    context.mkdir()
    build_context.write_context(plan, flavour, context, wheelhouse)
    if single_layer:
        lines = (context / "Dockerfile").read_text().splitlines()
        copies = [line for line in lines if line.startswith("COPY --from=wheels /layers/")]
        sources = " ".join(line.split()[2] for line in copies)
        merged = [line for line in lines if line not in copies[1:]]
        merged[merged.index(copies[0])] = f"COPY --from=wheels {sources} /"
        (context / "Dockerfile").write_text("\n".join(merged) + "\n")
    args = {"BASE_IMAGE": build.choose_base(flavour.python, flavour.base_image), "FLAVOUR_ID": flavour.id,
            "SOURCE_DATE_EPOCH": str(names.SOURCE_DATE_EPOCH)}
    builder = engine.buildkit.BuildKitBuild(context, args, secrets=build_context.context_secrets(context))
    with tempfile.TemporaryDirectory(prefix="bench-iid-") as scratch:
        iidfile = Path(scratch) / "iid"
        command = builder.command(iidfile)
        if ref is None:  # the wheels stage into the cache only: nothing exported, nothing loaded
            command = [word for word in command if word != "--load"]
            command[-1:-1] = ["--target", "wheels", "--output", "type=cacheonly"]
        else:
            command[-1:-1] = ["--no-cache-filter", names.RUNTIME_STAGE]
        errors = engine.buildkit.run_buildx(command, lambda line: log.handle.write(line + "\n"))
        if errors is not None:
            raise SystemExit(f"{ref or 'wheels stage'}: {errors}")
        if ref is not None:
            engine.images.tag_image(iidfile.read_text().strip(), *ref.split(":"))


if __name__ == "__main__":
    sys.exit(main())
