"""The workloads: a Mixtral-style decoder block and a tracing-bound step. Fixed shapes and seeds, so every
flavour runs exactly the same work and figures compare across images.

The decoder block matters for the compile-time figure. scan_layers pays off when one layer is expensive to
compile, as in LLM decoders; with cheap layers (Linear+GELU) scan compiles *slower* than the unrolled loop on
CPU. So the block is what the mission's flagship model (Mixtral) runs: pre-norm causal self-attention with
rotary position embeddings, then a sparse mixture of SwiGLU experts with top-k routing, bias-free projections.
The experts are dispatched densely (every expert sees every token, weighted by its routing weight, zero when
not chosen), as static-shape XLA implementations do.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class DecoderDims:
    hidden: int
    heads: int
    mlp: int  # per expert
    experts: int
    top_k: int
    batch: int
    seq: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# The compile-time workload. What one layer costs XLA:CPU to compile grows with the experts (one SwiGLU per
# expert) while the parameter count stays at six tensors; scan_layers' own cost grows with the parameters
# (stacking them, unstacking their gradients), so the ratio measures the layer, not the bookkeeping. Measured
# on 2.9 at 32 layers, idle 2-core host: a dense SwiGLU block gave loop/scan 2.5-3.6x depending on shapes,
# this block 4.4-4.6x. Execution stays a few seconds at batch 1.
COMPILE_DIMS = DecoderDims(hidden=256, heads=4, mlp=256, experts=8, top_k=2, batch=1, seq=128)
# Small enough that the equality check of scan_layers vs the loop costs a few seconds.
EQUALITY_DIMS = DecoderDims(hidden=64, heads=4, mlp=64, experts=4, top_k=2, batch=2, seq=8)


class DecoderBlock(nn.Module):
    """x -> x + attn(norm(x)) -> x + moe(norm(x)); one input, one output of the same shape, as scan_layers
    requires. Everything the block needs is computed inside forward (no buffers), so scan can trace it."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.dims = dims
        self.attn_norm = nn.LayerNorm(dims.hidden, bias=False)
        self.qkv = nn.Linear(dims.hidden, 3 * dims.hidden, bias=False)
        self.out = nn.Linear(dims.hidden, dims.hidden, bias=False)
        self.moe_norm = nn.LayerNorm(dims.hidden, bias=False)
        self.router = nn.Linear(dims.hidden, dims.experts, bias=False)
        # The experts' weights stacked into one tensor per projection, gate and up fused.
        self.experts_gate_up = nn.Parameter(
            torch.randn(dims.experts, dims.hidden, 2 * dims.mlp) / math.sqrt(dims.hidden))
        self.experts_down = nn.Parameter(torch.randn(dims.experts, dims.mlp, dims.hidden) / math.sqrt(dims.mlp))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.attn_norm(x))
        return x + self._experts(self.moe_norm(x))

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = h.shape
        heads, head_dim = self.dims.heads, self.dims.head_dim
        q, k, v = (t.reshape(batch, seq, heads, head_dim).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        q, k = _rotary(q), _rotary(k)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim) + _causal_mask(seq, h)
        attended = torch.softmax(scores, dim=-1) @ v
        return self.out(attended.transpose(1, 2).reshape(batch, seq, hidden))

    def _experts(self, h: torch.Tensor) -> torch.Tensor:
        top_weights, top_experts = torch.topk(torch.softmax(self.router(h), dim=-1), self.dims.top_k, dim=-1)
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        mixed = torch.zeros_like(h)
        for expert in range(self.dims.experts):
            # Each token's weight for this expert: its renormalised routing weight, or zero if not in its top-k.
            weight = (top_weights * (top_experts == expert).to(h.dtype)).sum(dim=-1, keepdim=True)
            gate, up = (h @ self.experts_gate_up[expert]).chunk(2, dim=-1)
            mixed = mixed + weight * ((F.silu(gate) * up) @ self.experts_down[expert])
        return mixed


def _causal_mask(seq: int, like: torch.Tensor) -> torch.Tensor:
    # A large finite negative instead of -inf keeps softmax gradients finite on every backend.
    return torch.triu(torch.full((seq, seq), -1e9, dtype=like.dtype, device=like.device), diagonal=1)


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over the last dimension of [batch, heads, seq, head_dim]."""
    seq, head_dim = x.shape[-2], x.shape[-1]
    half = head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=x.dtype, device=x.device) / half))
    angles = torch.arange(seq, dtype=x.dtype, device=x.device)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def decoder_layers(count: int, dims: DecoderDims, seed: int) -> list[DecoderBlock]:
    """`count` blocks with deterministic weights, built on the CPU (move them with .to(device))."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [DecoderBlock(dims) for _ in range(count)]


def clone_layers(layers: list[DecoderBlock], device: torch.device) -> list[DecoderBlock]:
    return [copy.deepcopy(layer).to(device) for layer in layers]


def decoder_input(dims: DecoderDims, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(dims.batch, dims.seq, dims.hidden, generator=generator)


# The tracing workload: many tiny ops, so the time goes into tracing them, not into running them.
TRACE_WIDTH = 8
TRACE_WEIGHTS = 10
TRACE_ROUNDS = 40  # 5 ops per round -> 200 traced ops per step
TRACE_OPS_PER_STEP = 5 * TRACE_ROUNDS


def tracing_weights(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(TRACE_WIDTH, TRACE_WIDTH, generator=generator) / math.sqrt(TRACE_WIDTH)
            for _ in range(TRACE_WEIGHTS)]


def tracing_step(state: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """One step of TRACE_OPS_PER_STEP small ops; contracting (tanh, halves), so many steps stay finite."""
    for round_ in range(TRACE_ROUNDS):
        state = torch.tanh(state @ weights[round_ % len(weights)]) * 0.5 + state * 0.5
    return state
