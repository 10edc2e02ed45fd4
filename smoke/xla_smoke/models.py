"""The workloads: an LLM-style decoder block and a tracing-bound step. Fixed shapes and seeds, so every flavour
runs exactly the same work and figures compare across images.

The decoder block matters for the compile-time figure. scan_layers pays off when one layer is expensive to
compile, as in LLM decoders; with cheap layers (Linear+GELU) scan compiles *slower* than the unrolled loop on
CPU. So the block is what LLMs run: pre-norm causal self-attention with rotary position embeddings and a gated
(SwiGLU) MLP, bias-free projections.
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
    mlp: int
    batch: int
    seq: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# The compile-time workload: d=256 and an LLM-like sequence. On XLA:CPU the loop's compile cost grows with the
# sequence length while scan_layers' stays flat (measured on 2.9: seq 32 gave a loop/scan ratio near 2,
# seq 128 near 3); execution stays negligible at batch 1.
COMPILE_DIMS = DecoderDims(hidden=256, heads=4, mlp=512, batch=1, seq=128)
# Small enough that the equality check of scan_layers vs the loop costs a few seconds.
EQUALITY_DIMS = DecoderDims(hidden=64, heads=4, mlp=128, batch=2, seq=8)


class DecoderBlock(nn.Module):
    """x -> x + attn(norm(x)) -> x + swiglu(norm(x)); one input, one output of the same shape, as scan_layers
    requires. Everything the block needs is computed inside forward (no buffers), so scan can trace it."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.dims = dims
        self.attn_norm = nn.LayerNorm(dims.hidden, bias=False)
        self.qkv = nn.Linear(dims.hidden, 3 * dims.hidden, bias=False)
        self.out = nn.Linear(dims.hidden, dims.hidden, bias=False)
        self.mlp_norm = nn.LayerNorm(dims.hidden, bias=False)
        self.gate = nn.Linear(dims.hidden, dims.mlp, bias=False)
        self.up = nn.Linear(dims.hidden, dims.mlp, bias=False)
        self.down = nn.Linear(dims.mlp, dims.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = h.shape
        heads, head_dim = self.dims.heads, self.dims.head_dim
        q, k, v = (t.reshape(batch, seq, heads, head_dim).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        q, k = _rotary(q), _rotary(k)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim) + _causal_mask(seq, h)
        attended = torch.softmax(scores, dim=-1) @ v
        return self.out(attended.transpose(1, 2).reshape(batch, seq, hidden))


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
