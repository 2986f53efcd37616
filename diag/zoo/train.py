"""Deterministic CPU training utilities shared by the zoo's builders.

`deterministic(seed)` pins what makes a run repeatable on one machine: the
torch RNG, deterministic kernels and the thread count (reduction order in
CPU matmuls depends on it). Bitwise equality across CPUs with different
vector units is not promised; equality across runs on one machine is.

The schedule is linear warmup then cosine decay:
    lr(step) = lr * (step+1)/warmup                              step < warmup
             = lr * (m + (1-m) * (1 + cos(pi * p)) / 2),  p = (step-warmup)/(steps-warmup)
    e.g. lr 3e-3, warmup 20, steps 170, m 0.1: step 9 -> 1.5e-3, step 95 -> 1.65e-3, 169 -> ~3.0e-4

This module knows optimisation loops; it knows nothing about files.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from diag.zoo.data import sample_windows, tile_windows
from diag.zoo.recipes import TrainBudget

BUILD_THREADS = 2


@contextmanager
def deterministic(seed: int, threads: int = BUILD_THREADS) -> Iterator[torch.Generator]:
    """Seed torch, force deterministic kernels and a fixed thread count; restore after.
    Yields a torch.Generator seeded with `seed` for data sampling."""
    prev_threads, prev_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new empty tensor with NaN, a guard against kernels that
    # read memory they never wrote: no result changes without it, and on llama-tiny's training
    # step those fills were 800 calls and 7% of the time.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.manual_seed(seed)
    try:
        yield torch.Generator().manual_seed(seed)
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)
        torch.utils.deterministic.fill_uninitialized_memory = prev_fill


def lr_at(step: int, budget: TrainBudget) -> float:
    if step < budget.warmup:
        return budget.lr * (step + 1) / budget.warmup
    p = (step - budget.warmup) / max(1, budget.steps - budget.warmup)
    m = budget.min_lr_ratio
    return budget.lr * (m + (1 - m) * (1 + math.cos(math.pi * p)) / 2)


def make_optimizer(params, budget: TrainBudget, *, foreach: bool | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable params, weight decay on the matrices. foreach: torch's choice
    (None), or False: one parameter at a time, without the step-wide temporaries the multi-tensor
    step allocates (up to a copy of every parameter; the bench pair's 1.19 B-parameter drafter
    trains beside its target on one GPU, bench/pair.py)."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": budget.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=budget.lr, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)


@torch.enable_grad()
def optimize(params, budget: TrainBudget, loss_fn: Callable[[int], torch.Tensor], desc: str,
             after_step: Callable[[int], None] | None = None, *, foreach: bool | None = None) -> list[float]:
    """budget.steps AdamW steps of loss_fn(step) (its forward in budget.compute_dtype),
    grad-norm clipped at 1.0 (foreach: make_optimizer's). Returns the losses.
    Gradients are on whatever the caller's mode (a zoo entry first asked for inside a
    `torch.no_grad()` test or fixture is built there)."""
    params = [p for p in params if p.requires_grad]
    opt = make_optimizer(params, budget, foreach=foreach)
    losses = []
    bar = tqdm(range(budget.steps), desc=desc, leave=False, mininterval=1.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, budget)
        with compute(budget):
            loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if after_step is not None:
            after_step(step)
        losses.append(loss.detach().item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return losses


def compute(budget: TrainBudget):
    """The forward's precision: float32 as is, or bfloat16 under CPU autocast (matmuls in bf16,
    weights and their gradients fp32, losses computed in fp32 by their callers) where the CPU
    multiplies bf16 in hardware; elsewhere float32, since emulated bf16 matmuls are slower than
    float32 ones (a build is a draw of its machine's rounding either way)."""
    if budget.compute_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"compute_dtype {budget.compute_dtype!r}: expected 'float32' or 'bfloat16'")
    if budget.compute_dtype == "bfloat16" and native_bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), as torch reports it."""
    return cpu_has("_is_avx512_bf16_supported") or cpu_has("_is_amx_tile_supported")


def cpu_has(probe_name: str) -> bool:
    """torch.cpu's probe `probe_name` (a private one), False where this torch lacks it."""
    probe = getattr(torch.cpu, probe_name, None)
    return bool(probe()) if probe is not None else False


def lm_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """windows [B, T+1]: next-token cross entropy of inputs [:, :T] against [:, 1:]."""
    logits = model(input_ids=windows[:, :-1], use_cache=False).logits      # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())


def train_lm(model: torch.nn.Module, stream: torch.Tensor, budget: TrainBudget, gen: torch.Generator,
             desc: str, after_step: Callable[[int], None] | None = None) -> list[float]:
    """Next-token training on random windows of the train stream."""
    model.train()
    losses = optimize(model.parameters(), budget,
                      lambda _s: lm_loss(model, sample_windows(stream, budget.batch, budget.seq_len, gen)),
                      desc, after_step)
    model.eval()
    return losses


@torch.no_grad()
def perplexity(model: torch.nn.Module, stream: torch.Tensor, seq_len: int = 256,
               max_windows: int = 64, batch: int = 16) -> float:
    """exp(mean next-token cross entropy) over non-overlapping held-out windows."""
    windows = tile_windows(stream, seq_len, max_windows)                    # [W, T+1]
    if windows.numel() == 0:
        raise ValueError(f"held-out stream of {stream.numel()} ids is shorter than one window of {seq_len + 1}")
    total, count = 0.0, 0
    for chunk in windows.split(batch):
        logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        total += float(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
        count += chunk[:, 1:].numel()
    return math.exp(total / count)
