"""Measuring the step costs of the speedup model on the loaded models (DESIGN.md §6).

t_decode: one target forward of 1 token after a KV cache of `context` tokens;
t_verify(D): one target forward of D tokens after the same cache;
t_draft: one drafter depth step (one row at one position, prefix cache of `context`);
t_draft_extend: the drafter's step-1 pass over 2 new tokens (the accepted ones, typically).
Each is the minimum of `repeats` interleaved timed calls after a warm-up, synchronised on
CUDA, reported with its spread (min / median / max of the calls). These are batch-size-1
costs of *these* models on *this* machine: a measurement, never a verdict. A server's costs
differ (batching, CUDA graphs, tensor parallelism); they come from the server's own rates
(diagnoses/live_serving/calibrate.py) or the user (case `[speedup]`).

This module knows models and clocks; it knows nothing about files or reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from diag.drafter.model import Eagle3Drafter
from diag.diagnoses.pricing.model import StepCosts
from diag.target.engine_numerics import as_loaded
from diag.target.mla_latent import latent_mla, latent_wanted
from diag.target.sdpa import attention_without_cudnn
from diag.target.tree_forward import cache_kwarg


@dataclass(frozen=True)
class MeasuredCosts:
    """StepCosts (each the minimum of its calls) and the spread of those calls.
    spread: {"t_decode": {"min", "median", "max"}, "t_verify": {"4": {...}}, ...} in seconds."""

    costs: StepCosts
    spread: dict
    repeats: int


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _once(fn, dev, setup) -> float:
    state = setup()
    _sync(dev)
    t0 = time.perf_counter()
    fn(state)
    _sync(dev)
    return time.perf_counter() - t0


def _interleaved(jobs: dict, dev, repeats: int) -> dict:
    """jobs: name -> (fn, setup). One warm-up each, then `repeats` rounds that time every job
    once, in turn: name -> the list of its call times. Interleaving puts the same background
    load on every job; the minimum is the least disturbed call."""
    for fn, setup in jobs.values():
        fn(setup())
    times = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, (fn, setup) in jobs.items():
            times[name].append(_once(fn, dev, setup))
    return times


def _spread(ts: list[float]) -> dict:
    """[3, 1, 2] -> {"min": 1, "median": 2, "max": 3}."""
    s = sorted(ts)
    mid = len(s) // 2
    return {"min": s[0], "median": s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2, "max": s[-1]}


def _after(model: nn.Module, prefix: torch.Tensor, new: torch.Tensor):
    """(timed fn, untimed setup) for the forward of `new` after a KV cache of `prefix`. Each
    call sees exactly len(prefix) cached tokens: the cache is built once, then cut back to
    them after every call (`crop`, which transformers' DynamicCache has), so a job costs one
    prefill, not one per call; a cache that cannot be cut is rebuilt instead."""
    key = cache_kwarg(model)
    n = prefix.shape[1]
    pos = torch.arange(n, n + new.shape[1], device=new.device)[None]
    held: list = []

    def setup():
        if held and _cut(held[0], n):
            return held[0]
        out = model(input_ids=prefix, use_cache=True)
        held[:] = [getattr(out, key, None) or out.past_key_values]
        return held[0]

    return (lambda cache: model(input_ids=new, position_ids=pos, use_cache=True, **{key: cache})), setup


def _cut(cache, n: int) -> bool:
    """Drop the tokens after the first n from `cache` (`crop(-k)` removes k in every
    transformers 5.x); False when it cannot (then the caller rebuilds it): no `crop`, or a
    cache whose layers refuse it (NotImplementedError / ValueError, e.g. a sliding window)."""
    crop = getattr(cache, "crop", None)
    extra = cache.get_seq_length() - n if crop is not None else -1
    if extra < 0:
        return False
    try:
        if extra:
            crop(-extra)
    except (NotImplementedError, ValueError):
        return False
    return cache.get_seq_length() == n


@torch.no_grad()
def measure_costs(model: nn.Module, drafter: Eagle3Drafter, embed, draft_tokens: list[int], *,
                  context: int = 128, repeats: int = 7, vocab: int | None = None) -> MeasuredCosts:
    """Step costs of the target and drafter as loaded: an engine's rounding that diag emulates
    (target/engine_numerics.py) is its arithmetic, not its speed, so it is off while timing. On
    CUDA without cuDNN's attention, as every forward of diag's that changes shape (target/sdpa.py):
    its first use compiles kernels and plans each new shape, seconds a run paid here once the
    generation left it out (H100, 2 layers: target_costs_s 1.1 s while the generation had paid it,
    6.6-9.6 s after; reports/bench/NOTES.md), and servers attend with their own kernels; an MLA
    target over its latents there, as the engines attend (target/mla_latent.py)."""
    numerics = drafter.numerics
    dev = next(model.parameters()).device
    with as_loaded(model), attention_without_cudnn(dev), latent_mla(model, latent_wanted(dev)):
        drafter.set_numerics("transformers")
        try:
            return _measure(model, drafter, embed, draft_tokens, context, repeats, vocab)
        finally:
            drafter.set_numerics(numerics)


def _measure(model, drafter, embed, draft_tokens, context, repeats, vocab) -> MeasuredCosts:
    dev = next(model.parameters()).device
    vocab = vocab or model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=g).to(dev)
    jobs = {1: _after(model, prefix, prefix[:, :1])}
    for d in sorted(set(draft_tokens) - {1}):
        jobs[d] = _after(model, prefix, torch.randint(0, vocab, (1, d), generator=g).to(dev))
    t = _interleaved(jobs, dev, repeats)
    drafter_t = _drafter_costs(drafter, embed, context, repeats, g)
    costs = StepCosts(min(t[1]), min(drafter_t["step"]), {d: min(t[d]) for d in draft_tokens},
                      min(drafter_t["extend"]))
    spread = {"t_decode": _spread(t[1]), "t_draft": _spread(drafter_t["step"]),
              "t_verify": {str(d): _spread(t[d]) for d in sorted(set(draft_tokens))},
              "t_draft_extend": _spread(drafter_t["extend"])}
    return MeasuredCosts(costs, spread, repeats)


def _drafter_costs(drafter: Eagle3Drafter, embed, context: int, repeats: int, g) -> dict:
    c = drafter.cfg
    dev = next(drafter.parameters()).device
    dtype = next(drafter.parameters()).dtype
    tok = torch.randint(0, c.vocab_size, (1, context), generator=g).to(dev)
    aux = torch.randn(1, context, c.fc_in, generator=g).to(dev, dtype)
    valid = torch.ones(1, context, dtype=torch.bool, device=dev)
    emb = lambda ids: embed(ids.to(embed.weight.device)).to(dev, dtype)
    _, cache = drafter.prefix_step(emb(tok), drafter.project(aux), valid)
    e = emb(tok[:, -1:, None])                                               # [1, 1, 1, H]
    h = torch.randn(1, 1, 1, c.hidden_size, generator=g).to(dev, dtype)
    last = torch.full((1, 1), context - 1, dtype=torch.long, device=dev)     # the newest index
    step = lambda _: drafter.logits(drafter.deep_step(e, h, 2, cache, [], last)[0])
    extend = lambda _: drafter.logits(drafter.prefix_step(emb(tok[:, :2]), drafter.project(aux[:, :2]),
                                                          valid[:, :2])[0])
    none = lambda: None
    return _interleaved({"step": (step, none), "extend": (extend, none)}, dev, repeats)
