"""Which lock modules a flavour tag visits on its way through `build` (issue 36: "the walk visits the lock home once").

Runs build's own per-flavour step (`_Run._build_and_tag`) for one committed flavour, with its two engine calls
stood in for (the base image is given; the build stops where the engine would start, after the context is
written), under sys.setprofile, and prints every call that enters a lock module from outside the lock modules
and every hop between two lock modules. No engine, no network (index wheels absent from the wheelhouse are
simply left to pip). Works on the trees before the two regroups too (c1befa1 "run/ by job", 38fb4cc "locks in
one home"): the modules are looked up by their names of today and of then (HISTORICAL_* below: gone).

    PYTHONPATH=$PWD python benchmarks/lock_walk.py [TAG]
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

from xla_images.generate.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
# The lock modules of today...
CURRENT_LOCK_MODULES = ("xla_images.model.lockfile", "xla_images.run.packages.lock", "xla_images.run.packages.layout")
# ...and those of the trees before the regroups, which no longer exist: kept so the walk still runs there, for
# the before/after comparison (c1befa1 moved run.wheels to run.packages.lock and run.layout to
# run.packages.layout; 38fb4cc folded generate.lock_policy into model.lockfile).
HISTORICAL_LOCK_MODULES = ("xla_images.generate.lock_policy", "xla_images.run.wheels", "xla_images.run.layout")
LOCK_MODULES = CURRENT_LOCK_MODULES + HISTORICAL_LOCK_MODULES
# generate.sync's lock part: `_lock_findings` today (it asks model.lockfile.lock_status); before 38fb4cc sync
# also had its own `lock_status` (historical).
SYNC_LOCK_FUNCTIONS = ("_lock_findings", "lock_status")
BUILD_MODULES = ("xla_images.run.building.build", "xla_images.run.build")  # today's; before c1befa1 (historical)


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
    build = _module(*BUILD_MODULES)
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
