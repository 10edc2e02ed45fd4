#!/usr/bin/env python3
"""Build figures on the real engine. Prints figures; asserts nothing.

    python benchmarks/bench_build.py [FLAVOUR] [--with OTHER] [--force | --no-build] [--matrix matrix.yaml]

For FLAVOUR (default r2.9.0_3.11_cpu):
  * build time: builds it (with --force: from scratch of the flavour's own steps; otherwise only if it is not
    up to date, else the time recorded at the end of its reports/<tag>/build.log is shown);
  * no-op rebuild time: `build` of the up-to-date flavour (goal: seconds);
  * size overhead: runtime image size / (base image size + installed payload, i.e. `du -sb /opt/venv` in the
    image); goal <= 1.10;
  * layer sharing: bytes two flavours of the same python share (their common ancestor image's size). With
    --with OTHER, or any other local xla-images image of the same python and base; with none, the bytes any
    second flavour of this python would share (the base stage) are shown.
With --no-build nothing is built: the sizes of the existing xla-images:<tag> are measured even if its
inputs changed since (then no build or no-op time is shown).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xla_images import names  # noqa: E402
from xla_images.generate.plan import load_plan  # noqa: E402
from xla_images.run.building import build
from xla_images.run import engine
from xla_images.run.building.build import BuildOptions, Outcome

DEFAULT_FLAVOUR = "r2.9.0_3.11_cpu"
SIZE_GOAL = 1.10
BUILT_IN = re.compile(r"^built in ([0-9.]+) s$")


class Lines:
    """Reporter: step lines to stderr so a long build shows life."""

    def state(self, flavour, text: str) -> None:
        if text.startswith("Step "):
            print(f"  [{flavour.tag}] {text[:110]}", file=sys.stderr)

    def line(self, flavour, text: str) -> None:
        pass

    def finished(self, result) -> None:
        pass

    def notice(self, text: str) -> None:
        print(text, file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("flavour", nargs="?", default=DEFAULT_FLAVOUR)
    parser.add_argument("--with", dest="other", default=None, help="a second built flavour of the same python")
    parser.add_argument("--force", action="store_true", help="rebuild FLAVOUR to time a full build")
    parser.add_argument("--no-build", action="store_true", help="only measure the existing image")
    parser.add_argument("--matrix", type=Path, default=Path(__file__).resolve().parents[1] / "matrix.yaml")
    args = parser.parse_args()

    plan = load_plan(args.matrix)
    flavour = plan.select((args.flavour,))[0]
    print(f"flavour {flavour.tag}")

    if not args.no_build:
        _print_build_times(plan, flavour, args.force)
    elif build.built_image_id(flavour) is None:
        print("build time:            n/a (--no-build; the image's inputs changed since it was built)")

    ref = names.local_ref(flavour.tag)
    image = engine.images.image_inspect(ref)
    if image is None:
        sys.exit(f"{ref} is not on the engine: build it first")
    _measure(flavour, ref, image, args.other)


def _print_build_times(plan, flavour, force: bool) -> None:
    result = _build(plan, flavour, force=force)
    if result.outcome is Outcome.BUILT:
        print(f"build time:            {result.seconds:8.1f} s  (base {result.base_image})")
    elif result.outcome is Outcome.SKIPPED:
        recorded = _recorded_build_seconds(result.log)
        shown = f"{recorded:8.1f} s  (recorded in {result.log}; --force to measure)" if recorded else "n/a"
        print(f"build time:            {shown}")
    else:
        sys.exit(f"build {result.outcome.value}: {result.message}")

    noop = _build(plan, flavour, force=False)
    assert noop.outcome is Outcome.SKIPPED, noop.outcome
    print(f"no-op rebuild:         {noop.seconds:8.2f} s  (goal: seconds)")


def _measure(flavour, ref: str, image: dict, other: str | None) -> None:
    base_ref = image["Config"]["Labels"].get("org.opencontainers.image.base.name", "")
    base = engine.images.image_inspect(base_ref) if base_ref else None
    venv = _venv_bytes(ref)
    if base is None:
        print(f"size overhead:         n/a (base image {base_ref!r} is not on the engine)")
    else:
        ratio = image["Size"] / (base["Size"] + venv)
        verdict = "ok" if ratio <= SIZE_GOAL else "OVER GOAL"
        print(f"runtime image size:    {image['Size'] / 1e9:8.3f} GB")
        print(f"base image size:       {base['Size'] / 1e9:8.3f} GB  ({base_ref})")
        print(f"installed /opt/venv:   {venv / 1e9:8.3f} GB")
        print(f"size overhead:         {ratio:8.3f}  (image / (base + venv); goal <= {SIZE_GOAL}: {verdict})")

    _print_sharing(flavour, ref, base_ref, other)


def _build(plan, flavour, *, force: bool) -> build.FlavourResult:
    started = time.monotonic()
    result = build.build_flavours(plan, [flavour], BuildOptions(force=force), Lines())[0]
    result.seconds = time.monotonic() - started
    return result


def _recorded_build_seconds(log: Path | None) -> float | None:
    if log is None or not log.is_file():
        return None
    for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
        found = BUILT_IN.match(line.strip())
        if found:
            return float(found.group(1))
    return None


def _venv_bytes(ref: str) -> int:
    run = engine.containers.run_container(ref, ["du", "-sb", "/opt/venv"], role="bench")
    if run.exit_code != 0:
        sys.exit(f"du in {ref} failed: {run.output}")
    return int(run.output.split()[0])


def _print_sharing(flavour, ref: str, base_ref: str, other: str | None) -> None:
    partner = f"{names.LOCAL_REPOSITORY}:{other}" if other else _same_python_partner(flavour, ref, base_ref)
    layers = engine.images.image_layers(ref)
    if partner is not None:
        common = _common_prefix(layers, engine.images.image_layers(partner))
        shared = _prefix_bytes(ref, common)
        print(f"shared with {partner}: {shared / 1e9:.3f} GB in {common} layer(s) (stored once)")
        return
    base_layers = len(engine.images.image_layers(base_ref)) if base_ref else 0
    shared = _prefix_bytes(ref, base_layers + 1)
    print(f"shared layers:         {shared / 1e9:8.3f} GB (base image + base stage, {base_layers + 1} layer(s)): "
          "what every other flavour of this python reuses; build one and pass --with TAG to measure a pair")


def _same_python_partner(flavour, ref: str, base_ref: str) -> str | None:
    me = engine.images.image_inspect(ref)["Id"]
    for item in engine.images.images_labelled({"io.xla-images.python": flavour.python}):
        labels = item.get("Labels") or {}
        if item["Id"] == me or labels.get("org.opencontainers.image.base.name") != base_ref:
            continue
        ours = [name for name in item.get("RepoTags") or [] if name.startswith(f"{names.LOCAL_REPOSITORY}:")]
        if ours:
            return ours[0]
    return None


def _common_prefix(first: list[str], second: list[str]) -> int:
    count = 0
    for one, two in zip(first, second):
        if one != two:
            break
        count += 1
    return count


def _prefix_bytes(ref: str, layer_count: int) -> int:
    """Size of the ancestor of `ref` made of exactly its first `layer_count` layers (classic builds keep
    their parent chain locally); its Size is the bytes of those layers."""
    attrs = engine.images.image_inspect(ref)
    best = 0
    while attrs is not None:
        count = len(attrs["RootFS"]["Layers"])
        if count == layer_count:
            return int(attrs["Size"])
        if count < layer_count:
            best = int(attrs["Size"])
            break
        parent = attrs.get("Parent")
        attrs = engine.images.image_inspect(parent) if parent else None
    return best


if __name__ == "__main__":
    main()
