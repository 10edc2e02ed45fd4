"""Runs the selected checks one after the other and turns each into a CheckResult.

A check that raises becomes status "error" carrying the exception text: one broken check must not hide the
results of the others, and the host side needs the text, not a traceback on stderr.
"""
from __future__ import annotations

import gc
import sys
import time
import traceback
from typing import Any, Optional, TextIO

from xla_smoke import checks, report
from xla_smoke.context import Context
from xla_smoke.report import CheckResult, Outcome


def run_suite(context: Context, selected: list[str], progress: Optional[TextIO] = None) -> dict[str, Any]:
    """Progress lines go to `progress` (default: the current sys.stderr); the report is returned."""
    progress = progress if progress is not None else sys.stderr
    started = time.perf_counter()
    context.suite_metrics = report.empty_suite_metrics(context.headline_layers)
    # The environment is described even when its check is not selected: every report says what it ran on.
    from xla_smoke.checks.environment import probe
    context.environment = probe()
    unusable = context.environment.get("errors")
    if not unusable:
        from xla_smoke import compat
        context.environment["matmul_precision"] = compat.use_highest_matmul_precision()
    results = [_not_run(name, unusable, progress) if unusable and name != "environment"
               else _run_one(name, context, progress) for name in selected]
    return report.build(context.expectations.as_dict(), context.environment, results, context.suite_metrics,
                        time.perf_counter() - started)


def _run_one(name: str, context: Context, progress: TextIO) -> CheckResult:
    print(f"[xla_smoke] {name} ...", file=progress, flush=True)
    started = time.perf_counter()
    try:
        outcome = checks.entry_point(name)(context)
    except Exception as exc:  # noqa: BLE001 - any exception is this check's result, by design
        outcome = Outcome(report.ERROR, _describe(exc), {"traceback": _short_traceback(exc)})
    finally:
        # Lazy tensors a check leaves behind would be executed by the next check's sync: drop them now.
        gc.collect()
    seconds = time.perf_counter() - started
    print(f"[xla_smoke] {name}: {outcome.status} ({seconds:.1f}s)", file=progress, flush=True)
    return CheckResult(name, outcome.status, seconds, outcome.message, outcome.metrics)


def _not_run(name: str, reasons: list[str], progress: TextIO) -> CheckResult:
    """torch_xla cannot be imported or cannot open its device: a check that tried anyway could abort the whole
    process (a second PJRT client initialisation after a failed one does), losing the report."""
    print(f"[xla_smoke] {name}: error (torch_xla unusable)", file=progress, flush=True)
    return CheckResult(name, report.ERROR, 0.0, "not run, torch_xla is unusable: " + "; ".join(reasons), {})


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {text}"


def _short_traceback(exc: BaseException, frames: int = 6) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines[-frames:])

