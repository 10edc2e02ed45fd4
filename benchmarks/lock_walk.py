"""Which lock modules a flavour tag visits on its way through `build` (issue 36: "the walk visits the lock home once").

Runs build's own per-flavour step (`_Run._build_and_tag`) for one committed flavour, with its two engine calls
stood in for (the base image is given; the build stops where the engine would start, after the context is
written), under sys.setprofile, and prints every call that enters a lock module from outside the lock modules
and every hop between two lock modules. No engine, no network (index wheels absent from the wheelhouse are
simply left to pip). Works on the tree before the regroup too (the modules are looked up by both names).

    PYTHONPATH=$PWD python benchmarks/lock_walk.py [TAG]
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

from xla_images.generate.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
LOCK_MODULES = ("xla_images.model.lockfile", "xla_images.generate.lock_policy", "xla_images.run.wheels",
                "xla_images.run.layout", "xla_images.run.packages.lock", "xla_images.run.packages.layout")
SYNC_LOCK_FUNCTIONS = ("lock_status", "_lock_findings")  # generate.sync's lock part (before the regroup)


class EngineReached(Exception):
    """The walk got to where the engine would build: the lock's part is over."""


def _module(*names: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(names)


def _is_lock(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module in LOCK_MODULES or (module == "xla_images.generate.sync"
                                      and frame.f_code.co_name in SYNC_LOCK_FUNCTIONS)


def _where(frame) -> str:
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


def walk(tag: str | None) -> tuple[list[str], list[str]]:
    build = _module("xla_images.run.building.build", "xla_images.run.build")
    plan = load_plan(ROOT / "matrix.yaml")
    flavour = plan.select((tag,))[0] if tag else next(f for f in plan.flavours if f.accelerator.value == "cpu")
    run = build._Run(plan, build.BuildOptions(), reporter=type("Quiet", (), {"state": lambda *a: None})())
    run.buildkit = False
    run.bases = type("Given", (), {"resolve": lambda self, flavour: "debian:base"})()

    def engine_starts(*args, **kwargs):
        raise EngineReached()

    build.prepare_classic_context = engine_starts  # the first engine-bound step of the classic path
    entries: list[str] = []
    hops: list[str] = []

    def profile(frame, event, arg) -> None:
        if event != "call" or not _is_lock(frame) or frame.f_back is None:
            return
        caller = frame.f_back
        if not _is_lock(caller):
            entries.append(f"{_where(caller)} -> {_where(frame)}")
        elif caller.f_globals.get("__name__") != frame.f_globals.get("__name__"):
            hops.append(f"{_where(caller)} -> {_where(frame)}")

    result = build.FlavourResult(flavour)
    sys.setprofile(profile)
    try:
        run._build_and_tag(flavour, result, lambda text: None)
    except EngineReached:
        pass
    finally:
        sys.setprofile(None)
    return entries, hops


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory():
        entries, hops = walk(tag)
    print(f"entries into the lock modules from outside them: {len(entries)}")
    for line in entries:
        print(f"  {line}")
    print(f"hops between lock modules: {len(hops)}")
    for line in sorted(set(hops)):
        print(f"  {line} (x{hops.count(line)})")


if __name__ == "__main__":
    main()
