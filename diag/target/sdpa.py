"""Which of torch's attention backends diag's own forwards leave out.

cuDNN's attention builds an execution plan for every new shape (public reports: up to a few
hundred ms each; sglang PR 4650, mlx PR 2743), and torch picks it on Hopper. Where the shapes keep
changing (transformers' generate: the keys one longer every step; the decode loop, whose drafter's
cache grows every round; the step-cost probe, a shape per tree size) or a forward is captured in
a CUDA graph (the decode loop's verify), diag runs without it: a run then never pays cuDNN's
first use either (its attention compiles kernels when first called). This module knows torch's
flags."""

from __future__ import annotations

import contextlib

import torch


def attention_without_cudnn(dev: torch.device):
    """On CUDA, torch's attention without its cuDNN backend (flash, memory-efficient or the plain
    math, whichever takes the call), elsewhere nothing. On the H100 the first run's generation
    took 125 ms a step at 2 layers (16 rows, 256 steps) against 9.8 ms once the same shapes had
    been seen (reports/bench/NOTES.md, fifteenth stop)."""
    if torch.device(dev).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
