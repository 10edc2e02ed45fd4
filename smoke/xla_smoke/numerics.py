"""Comparing results against a reference, with messages that say where and by how much they differ."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch.utils._pytree import tree_flatten

# float32 on XLA vs eager differs in the last bits (fused ops, other transcendental approximations).
RTOL = 1e-4
ATOL = 1e-5


def mismatch(label: str, expected: torch.Tensor, actual: Optional[torch.Tensor],
             rtol: float = RTOL, atol: float = ATOL) -> Optional[str]:
    """None when close, else a one-line description. Both sides are compared on the CPU."""
    if actual is None:
        return f"{label}: missing (expected a tensor of shape {tuple(expected.shape)})"
    expected_cpu = expected.detach().cpu().to(torch.float64)
    actual_cpu = actual.detach().cpu().to(torch.float64)
    if expected_cpu.shape != actual_cpu.shape:
        return f"{label}: shape {tuple(actual_cpu.shape)}, expected {tuple(expected_cpu.shape)}"
    if not torch.isfinite(actual_cpu).all():
        return f"{label}: contains NaN or inf"
    if torch.allclose(actual_cpu, expected_cpu, rtol=rtol, atol=atol):
        return None
    worst = (actual_cpu - expected_cpu).abs().max().item()
    return f"{label}: max abs difference {worst:.3g} exceeds rtol={rtol:g}, atol={atol:g}"


def tree_mismatches(label: str, expected: Any, actual: Any, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """Compare two pytrees leaf by leaf; a different structure is itself a mismatch."""
    expected_leaves, expected_spec = tree_flatten(expected)
    actual_leaves, actual_spec = tree_flatten(actual)
    if expected_spec != actual_spec:
        return [f"{label}: structure {actual_spec}, expected {expected_spec}"]
    problems = []
    for index, (want, have) in enumerate(zip(expected_leaves, actual_leaves)):
        if want is None and have is None:
            continue
        if want is None or have is None:
            problems.append(f"{label}[{index}]: {'unexpected' if want is None else 'missing'} value")
            continue
        problem = mismatch(f"{label}[{index}]", want, have, rtol, atol)
        if problem:
            problems.append(problem)
    return problems


def grads(tensors: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    return [t.grad for t in tensors]
