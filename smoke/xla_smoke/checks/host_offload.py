"""host_offload / host_offload_exec: activations offloaded to host memory in the forward pass and brought back
for the backward pass, with torch_xla.experimental.stablehlo_custom_call.place_to_host / place_to_device.

The workload is a layer whose saved activation lives in host memory between forward and backward, the use
upstream documents for these calls. `host_offload` inspects the lowered graph, which works on every backend:
the gradient graph must move the activation to `pinned_host` and that very value back to `device`.
`host_offload_exec` runs the same forward + backward and compares values and gradients with eager CPU torch;
only a TPU can execute the placement annotations (XLA:CPU rejects the custom call), so elsewhere it is skipped.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable

import torch

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.numerics import mismatch
from xla_smoke.report import Outcome, skipped, verdict

SHAPE = (64, 128)
SEED = 31
# TPU transcendental approximations and a sum over 8k elements; still far below any real error.
EXEC_RTOL = 1e-3
EXEC_ATOL = 1e-4

PLACEMENT_CALL = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=.*?custom-call\((?P<operands>[^)]*)\)"
    r".*custom_call_target=\"annotate_device_placement\".*_xla_buffer_placement=\"(?P<placement>\w+)\"",
    re.MULTILINE)


class _OffloadedSin(torch.autograd.Function):
    """sin(x) whose saved input waits in host memory until the backward pass needs it for cos(x)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        place_to_host, _ = compat.host_offload_ops()
        ctx.save_for_backward(place_to_host(x))
        return torch.sin(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _, place_to_device = compat.host_offload_ops()
        (offloaded,) = ctx.saved_tensors
        return grad * torch.cos(place_to_device(offloaded))


def _loss(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, sin: Callable) -> torch.Tensor:
    return torch.tanh(sin(x * scale) * shift).sum()


@dataclasses.dataclass
class _Pass:
    """Leaves and loss of one forward + backward."""

    leaves: list[torch.Tensor]
    loss: torch.Tensor

    @property
    def grads(self) -> list[torch.Tensor]:
        return [leaf.grad for leaf in self.leaves]


def _inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randn(SHAPE, generator=generator), torch.randn(SHAPE[-1], generator=generator),
            torch.randn(SHAPE[-1], generator=generator)]


def _forward_backward(inputs: list[torch.Tensor], device: torch.device, sin: Callable) -> _Pass:
    # Fresh leaves on every call: `.to("cpu")` of a CPU tensor returns the tensor itself, and marking the shared
    # input as requiring grad would turn the next call's `.to(device)` copies into non-leaves without .grad.
    leaves = [t.detach().clone().to(device).requires_grad_() for t in inputs]
    loss = _loss(*leaves, sin=sin)
    loss.backward()
    return _Pass(leaves, loss)


def placement_problems(hlo: str, source: str) -> tuple[list[str], dict[str, int]]:
    """The gradient graph must send a value to pinned_host and bring that same value back to device."""
    calls = [m.groupdict() for m in PLACEMENT_CALL.finditer(hlo)]
    to_host = {c["name"] for c in calls if c["placement"] == "pinned_host"}
    to_device = [c for c in calls if c["placement"] == "device"]
    round_trips = sum(1 for c in to_device if any(re.search(rf"%?{re.escape(name)}\b", c["operands"])
                                                  for name in to_host))
    counts = {"placement_calls": len(calls), "to_pinned_host": len(to_host), "to_device": len(to_device),
              "round_trips": round_trips}
    problems = []
    if not to_host:
        problems.append(f"no annotate_device_placement custom call with _xla_buffer_placement=\"pinned_host\" "
                        f"in the gradient graph ({source})")
    if not to_device:
        problems.append(f"no annotate_device_placement custom call with _xla_buffer_placement=\"device\" "
                        f"in the gradient graph ({source})")
    if to_host and to_device and not round_trips:
        problems.append("the value moved back to device is not the one offloaded to pinned_host")
    return problems, counts


def run_lowering(context: Context) -> Outcome:
    device = compat.device()
    # Traced, never executed here: on CPU the graph would be rejected. The tensors die with this frame, so no
    # later sync executes it.
    offloaded = _forward_backward(_inputs(), device, _OffloadedSin.apply)
    hlo, source = compat.hlo_text(offloaded.grads)
    problems, counts = placement_problems(hlo, source)
    return verdict(problems, f"forward saves to pinned_host, backward brings the value back to device "
                             f"({counts['round_trips']} round trip(s), {source})", **counts)


def run_execution(context: Context) -> Outcome:
    device = compat.device()
    kind = compat.device_kind(device)
    if kind != "TPU":
        return skipped(f"executing host offload needs a TPU (PJRT_DEVICE={os.environ.get('PJRT_DEVICE', kind)})",
                       device=kind)
    inputs = _inputs()
    reference = _forward_backward(inputs, torch.device("cpu"), torch.sin)
    offloaded = _forward_backward(inputs, device, _OffloadedSin.apply)
    problems, counts = placement_problems(*compat.hlo_text(offloaded.grads))
    compat.sync()
    compat.wait_device_ops()
    results = [("loss", reference.loss, offloaded.loss)]
    results += [(f"gradient {i}", want, have) for i, (want, have) in enumerate(zip(reference.grads, offloaded.grads))]
    problems += [p for p in (mismatch(label, want, have, EXEC_RTOL, EXEC_ATOL) for label, want, have in results) if p]
    return verdict(problems, "forward + backward with the activation offloaded to host memory match eager CPU "
                             "torch (loss and gradients)", device=kind, **counts)
