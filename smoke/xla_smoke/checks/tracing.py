"""tracing: how many steps per second the lazy tracer sustains on a tracing-bound model.

Each step is TRACE_OPS_PER_STEP tiny ops on 8x8 tensors, so the time goes into tracing and graph handling,
not into arithmetic. The graph is compiled during warm-up; a compile during the timed repeats fails the check,
because the figure would then measure the compiler. The final state must equal the same steps in eager CPU
torch, so a fast but wrong tracer cannot pass.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.models import TRACE_OPS_PER_STEP, TRACE_WIDTH, tracing_step, tracing_weights
from xla_smoke.numerics import mismatch
from xla_smoke.report import Outcome, verdict

SEED = 41
STEPS_PER_REPEAT = 20
MAX_WARMUP_STEPS = 5
# Hundreds of steps of float32 tanh on XLA vs eager: rounding differences accumulate, bounded by the tanh.
RTOL = 1e-3
ATOL = 1e-4


def run(context: Context) -> Outcome:
    device = compat.device()
    weights_cpu = tracing_weights(SEED)
    weights = [w.to(device) for w in weights_cpu]
    start = torch.randn(TRACE_WIDTH, TRACE_WIDTH, generator=torch.Generator().manual_seed(SEED + 1))
    state = start.to(device)

    state, warmup_steps, warm = _warm_up(state, weights)
    before = compat.compile_stats()
    rates = []
    for _ in range(context.trace_repeats):
        state, rate = _timed_repeat(state, weights)
        rates.append(rate)
    compiles = compat.compile_stats().since(before).count

    median = float(np.median(rates))
    iqr = float(np.percentile(rates, 75) - np.percentile(rates, 25))
    context.suite_metrics.update(trace_steps_per_s=round(median, 2), trace_steps_per_s_iqr=round(iqr, 2))

    problems = []
    if not warm:
        problems.append(f"the step graph was still compiling after {MAX_WARMUP_STEPS} warm-up steps")
    if compiles:
        problems.append(f"{compiles} compilation(s) during the timed repeats: the step graph was not cached")
    total_steps = warmup_steps + STEPS_PER_REPEAT * context.trace_repeats
    problem = mismatch(f"state after {total_steps} steps vs eager CPU", _eager(start, weights_cpu, total_steps),
                       state, RTOL, ATOL)
    if problem:
        problems.append(problem)
    return verdict(problems, f"{median:.1f} traced steps/s (IQR {iqr:.1f}) of {TRACE_OPS_PER_STEP} ops each",
                   trace_steps_per_s=round(median, 2), trace_steps_per_s_iqr=round(iqr, 2),
                   repeats=[round(r, 2) for r in rates], steps_per_repeat=STEPS_PER_REPEAT,
                   ops_per_step=TRACE_OPS_PER_STEP, warmup_steps=warmup_steps, compiles_while_timed=compiles)


def _warm_up(state: torch.Tensor, weights: list[torch.Tensor]) -> tuple[torch.Tensor, int, bool]:
    """Step until a step compiles nothing: then its graph is in the cache. Returns (state, steps, warm)."""
    for step in range(1, MAX_WARMUP_STEPS + 1):
        before = compat.compile_stats()
        state = tracing_step(state, weights)
        compat.sync()
        compat.wait_device_ops()
        if step > 1 and compat.compile_stats().since(before).count == 0:
            return state, step, True
    return state, MAX_WARMUP_STEPS, False


def _timed_repeat(state: torch.Tensor, weights: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
    """(new state, steps per second) over STEPS_PER_REPEAT steps, each traced and dispatched, waiting for the
    last one to finish."""
    started = time.perf_counter()
    for _ in range(STEPS_PER_REPEAT):
        state = tracing_step(state, weights)
        compat.sync()
    compat.wait_device_ops()
    return state, STEPS_PER_REPEAT / (time.perf_counter() - started)


def _eager(start: torch.Tensor, weights: list[torch.Tensor], steps: int) -> torch.Tensor:
    state = start.clone()
    for _ in range(steps):
        state = tracing_step(state, weights)
    return state
