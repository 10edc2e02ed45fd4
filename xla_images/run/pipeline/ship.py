"""`ship`: many images through build → test → push as one plan (run.pipeline.runner), on this engine.

Before anything is built: the engine and the registry must answer; each image this machine cannot build is set
aside as blocked, with why and the fix (no base for its python, its wheels on no source here), and does not fail
the others; a python whose base this machine can bootstrap gets it. Images the registry already holds with the
same flavour id are skipped (a resumed run). The run's figures go to reports/pipeline.json; each phase's own
output to its logs (reports/<tag>/build.log, checks, smoke) and reports/pipeline.log.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ... import diskio
from ...generate.plan import Plan
from ...model.registry import Registry
from ...model.target import Target
from .. import engine, registry as registries
from ..building import build as building
from ..building.groups import build_order
from ..checking import image_tests
from . import runner
from .ledger import Ledger, Result, Say
from .phases import BaseCheck, EnginePhases, blocked_by_wheels

REPORT_NAME = "pipeline.json"
LOG_NAME = "pipeline.log"


@dataclass(frozen=True)
class ShipOptions:
    registry: Registry
    published_path: Path
    reports_root: Path
    build: building.BuildOptions = building.BuildOptions()
    test: image_tests.ImageTestOptions = image_tests.ImageTestOptions()
    runner: runner.RunnerOptions = runner.RunnerOptions()
    bootstrap_bases: bool = True


def ship(plan: Plan, flavours: list[Target], options: ShipOptions, say: Say) -> Ledger:
    """Take every flavour as far as it goes; the ledger (also reports/pipeline.json) says how far."""
    ordered = build_order(flavours)
    ledger = Ledger(ordered, say)
    engine.connection.client()  # no engine: one error, before anything else
    client = registries.connect(options.registry, registries.WRITE, named=(options.registry.host,))
    client.check_reachable()    # a registry that does not answer fails the run before hours of builds
    with diskio.LogFile(options.reports_root / LOG_NAME, "the pipeline log") as log:
        detail = _locked(log)
        runnable = _set_aside_blocked(plan, ordered, ledger, BaseCheck(say, options.bootstrap_bases))
        ledger.note(f"{len(runnable)} image(s) to take through build → test → push, "
                    f"{len(ordered) - len(runnable)} set aside; details in {options.reports_root / LOG_NAME}")
        phases = EnginePhases(plan, options.build, options.test, options.registry, client, options.published_path,
                              options.reports_root, plan.site.compression, detail)
        try:
            runner.run(runnable, phases, ledger, options.runner)
        finally:
            ledger.write(options.reports_root / REPORT_NAME)
    return ledger


def _set_aside_blocked(plan: Plan, ordered: list[Target], ledger: Ledger, bases: BaseCheck) -> list[Target]:
    runnable = []
    for flavour in ordered:
        blocked = blocked_by_wheels(plan, flavour) or bases.blocked(flavour)
        if blocked is None:
            runnable.append(flavour)
        else:
            ledger.settle(flavour, Result.BLOCKED, blocked.reason, blocked.fix)
    return runnable


def _locked(log: diskio.LogFile) -> Say:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            log.write(line + "\n")

    return write
