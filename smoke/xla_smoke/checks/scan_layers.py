"""scan_layers: torch_xla.experimental.scan_layers.scan_layers over decoder blocks equals the plain loop.

Same blocks, same weights, same input, both on the XLA device: the output, the input's gradient and every
parameter's gradient must match, and the scanned graph must contain a while loop.
"""
from __future__ import annotations

import torch

from xla_smoke import compat
from xla_smoke.context import Context
from xla_smoke.models import EQUALITY_DIMS, clone_layers, decoder_input, decoder_layers
from xla_smoke.numerics import mismatch
from xla_smoke.report import Outcome, verdict

LAYERS = 2
SEED = 11
# The loss weights every output element differently, so a permuted or partly wrong output changes gradients.
PROBE_SEED = 12
# Both sides run on XLA but scan reorders the arithmetic (stacked weights, another fusion): allow float noise.
RTOL = 1e-4
ATOL = 1e-4


def run(context: Context) -> Outcome:
    device = compat.device()
    blocks = decoder_layers(LAYERS, EQUALITY_DIMS, SEED)
    loop_blocks, scan_blocks = clone_layers(blocks, device), clone_layers(blocks, device)
    x = decoder_input(EQUALITY_DIMS, SEED)
    probe = torch.randn(x.shape, generator=torch.Generator().manual_seed(PROBE_SEED)).to(device)

    loop_x = x.to(device).requires_grad_()
    loop_out = loop_x
    for block in loop_blocks:
        loop_out = block(loop_out)
    (loop_out * probe).sum().backward()

    # No sync between the loop and scan_layers: one graph, one compile. An XLA:CPU compile of 2.9 has a large
    # fixed cost (docs/figures.md); one compile instead of two took this check from 11.6 to 9.9 CPU seconds.
    scan_x = x.to(device).requires_grad_()
    scan_out = compat.scan_layers(scan_blocks, scan_x)
    (scan_out * probe).sum().backward()
    problems = _while_problems(scan_out)
    compat.sync()

    problems += _compare(loop_x, loop_out, loop_blocks, scan_x, scan_out, scan_blocks)
    parameters = sum(1 for block in scan_blocks for _ in block.parameters())
    return verdict(problems, f"{LAYERS} decoder blocks: output, input gradient and {parameters} parameter "
                             f"gradients equal the loop",
                   layers=LAYERS, hidden=EQUALITY_DIMS.hidden, parameters_compared=parameters)


def _while_problems(scan_out: torch.Tensor) -> list[str]:
    text, source = compat.hlo_text([scan_out])
    return [] if "while(" in text else [f"the scan_layers graph has no while loop ({source})"]


def _compare(loop_x: torch.Tensor, loop_out: torch.Tensor, loop_blocks: list, scan_x: torch.Tensor,
             scan_out: torch.Tensor, scan_blocks: list) -> list[str]:
    problems = [p for p in (mismatch("output", loop_out, scan_out, RTOL, ATOL),
                            mismatch("input gradient", loop_x.grad, scan_x.grad, RTOL, ATOL)) if p]
    for index, (loop_block, scan_block) in enumerate(zip(loop_blocks, scan_blocks)):
        for (name, loop_param), (_, scan_param) in zip(loop_block.named_parameters(),
                                                       scan_block.named_parameters()):
            if loop_param.grad is None:
                problems.append(f"layer {index} {name}: the loop produced no gradient")
                continue
            problem = mismatch(f"layer {index} {name} gradient", loop_param.grad, scan_param.grad, RTOL, ATOL)
            if problem:
                problems.append(problem)
    return problems
