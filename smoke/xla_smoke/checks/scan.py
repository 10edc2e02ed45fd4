"""scan: torch_xla.experimental.scan.scan against an eager python loop on the CPU.

For several step functions (single tensors; tuple carry with tuple ys; dict carry and dict xs with tuple ys)
the final carry, the stacked ys and the gradients of init and xs must equal the eager loop's. The scan must
lower to an XLA while loop (not be unrolled), and calling it again with new values of the same shapes must not
compile again.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.numerics import tree_mismatches
from xla_smoke.report import Outcome, verdict


def _cumulative(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    new_carry = carry * 0.9 + torch.sin(x)
    return new_carry, new_carry * 2.0


def _tuple_carry(carry: tuple[torch.Tensor, torch.Tensor], x: tuple[torch.Tensor, torch.Tensor]) -> Any:
    h, c = carry
    a, b = x
    new_h = torch.tanh(h * a + c)
    new_c = c + (b * new_h).sum(dim=-1, keepdim=True)
    return (new_h, new_c), (new_h * 2.0, torch.cos(new_c))


def _dict_carry(carry: dict[str, torch.Tensor], x: dict[str, torch.Tensor]) -> Any:
    new_a = torch.sin(carry["a"] @ x["w"] + x["bias"])
    new_b = torch.cos(carry["b"] @ x["w"] + x["bias"])
    return {"a": new_a, "b": new_b}, (torch.sigmoid(new_a + new_b), new_a.sum(dim=-1))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    # (init shapes, xs shapes): pytrees whose leaves are shape tuples, so a tuple *node* is written as a list.
    shapes: tuple[Any, Any]
    pure: bool  # pass is_fn_pure where the release supports it, to exercise that path too

    def inputs(self, seed: int) -> tuple[Any, Any]:
        generator = torch.Generator().manual_seed(seed)
        make = lambda shape: torch.randn(*shape, generator=generator)  # noqa: E731
        init_shapes, xs_shapes = self.shapes
        return _map_shapes(make, init_shapes), _map_shapes(make, xs_shapes)


def _map_shapes(make: Callable, shapes: Any) -> Any:
    if isinstance(shapes, dict):
        return {key: _map_shapes(make, value) for key, value in shapes.items()}
    if isinstance(shapes, list):
        return tuple(_map_shapes(make, value) for value in shapes)
    return make(shapes)


CASES = (
    Case("tensor", _cumulative, ((4, 5), (6, 4, 5)), pure=False),
    Case("tuple", _tuple_carry, ([(3, 4), (3, 1)], [(5, 3, 4), (5, 3, 4)]), pure=False),
    Case("dict", _dict_carry, ({"a": (2, 3), "b": (2, 3)}, {"w": (5, 3, 3), "bias": (5, 2, 3)}), pure=True),
)
RECOMPILE_CASE = CASES[-1]


def run(context: Context) -> Outcome:
    device = compat.device()
    problems: list[str] = []
    for case in CASES:
        problems += _check_case(case, device, seed=1, check_while=True)
    before = compat.compile_stats()
    problems += _check_case(RECOMPILE_CASE, device, seed=2, check_while=False)
    recompiles = compat.compile_stats().since(before).count
    if recompiles:
        problems.append(f"{RECOMPILE_CASE.name}: a second call with the same shapes compiled {recompiles} more "
                        f"graph(s); the scan graph was not reused")
    return verdict(problems, f"{len(CASES)} step functions match the eager loop (values and gradients); "
                             f"second call compiled nothing",
                   cases=[case.name for case in CASES], second_call_compiles=recompiles,
                   is_fn_pure_supported=compat.scan_supports_purity())


def _check_case(case: Case, device: torch.device, seed: int, check_while: bool) -> list[str]:
    init, xs = case.inputs(seed)
    expected_carry, expected_ys, expected_grads = _eager_reference(case.fn, init, xs)

    xla_init = tree_map(lambda t: t.to(device).requires_grad_(), init)
    xla_xs = tree_map(lambda t: t.to(device).requires_grad_(), xs)
    carry, ys = compat.scan(case.fn, xla_init, xla_xs, pure=case.pure)
    _sum_leaves((carry, ys)).backward()
    problems = []
    if check_while:
        problems += _while_loop_problems(case.name, ys)
    compat.sync()

    label = f"{case.name} (seed {seed})"
    problems += tree_mismatches(f"{label} carry", expected_carry, carry)
    problems += tree_mismatches(f"{label} ys", expected_ys, ys)
    actual_grads = (tree_map(lambda t: t.grad, xla_init), tree_map(lambda t: t.grad, xla_xs))
    problems += tree_mismatches(f"{label} grads", expected_grads, actual_grads)
    return problems


def _eager_reference(fn: Callable, init: Any, xs: Any) -> tuple[Any, Any, Any]:
    """The plain python loop scan stands for, on CPU torch, with its own leaves and gradients."""
    init = tree_map(lambda t: t.clone().requires_grad_(), init)
    xs = tree_map(lambda t: t.clone().requires_grad_(), xs)
    carry, ys = _loop_scan(fn, init, xs)
    _sum_leaves((carry, ys)).backward()
    grads = (tree_map(lambda t: t.grad, init), tree_map(lambda t: t.grad, xs))
    return tree_map(torch.Tensor.detach, carry), tree_map(torch.Tensor.detach, ys), grads


def _loop_scan(fn: Callable, init: Any, xs: Any) -> tuple[Any, Any]:
    xs_leaves, xs_spec = tree_flatten(xs)
    carry = init
    steps = []
    for index in range(xs_leaves[0].shape[0]):
        carry, y = fn(carry, tree_unflatten([leaf[index] for leaf in xs_leaves], xs_spec))
        steps.append(tree_flatten(y))
    ys_spec = steps[0][1]
    stacked = [torch.stack([leaves[i] for leaves, _ in steps]) for i in range(len(steps[0][0]))]
    return carry, tree_unflatten(stacked, ys_spec)


def _sum_leaves(tree: Any) -> torch.Tensor:
    leaves = [leaf for leaf in tree_flatten(tree)[0] if leaf is not None]
    total = leaves[0].sum()
    for leaf in leaves[1:]:
        total = total + leaf.sum()
    return total


def _while_loop_problems(name: str, ys: Any) -> list[str]:
    text, source = compat.hlo_text(tree_flatten(ys)[0])
    if "while(" in text:
        return []
    return [f"{name}: the scan graph has no while loop ({source}); scan was unrolled or not lowered"]
