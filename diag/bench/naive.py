"""The naive loop diag replaces, timed per position: at each position of a continuation,
(1) one target decode step with a KV cache (capturing the layout's points by hooks),
(2) one drafter call over the sequence so far (a chain of `steps`), (3) one target verify
forward of the `steps` drafted tokens, after which the cache is cropped back.
This is what measuring acceptance "the server's way", one position at a time, costs.

Worked example, prompt 64 tokens, positions 8, steps 3: the cache is filled with the
prompt once, then 8 rounds of (decode 1, draft 3, verify 3, crop to 64 + round + 1).
This module knows models and caches; nothing about files or reports.
"""

from __future__ import annotations

import time

import torch

from diag.bench.common import sync
from diag.target.capture import hooks
from diag.layouts import layout


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


class _Phases:
    """Per-position seconds of each phase (synchronised), medians over positions."""

    def __init__(self):
        self.rows: dict[str, list[float]] = {}
        self.t = 0.0

    def start(self):
        sync()
        self.t = time.perf_counter()

    def mark(self, name: str):
        sync()
        now = time.perf_counter()
        self.rows.setdefault(name, []).append(now - self.t)
        self.t = now

    def medians(self, skip: int = 1) -> dict[str, float]:
        return {f"{k}_s": _median(v[skip:]) for k, v in self.rows.items()}


def _top_ops(prof, key: str, n: int = 12) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:n]
    return [{"op": e.key[:80], "ms": getattr(e, key, 0) / 1e3, "calls": e.count} for e in rows]


@torch.no_grad()
def naive_loop(model, drafter, embed, ids: torch.Tensor, lay_name: str, *, prompt_len: int,
               positions: int, steps: int = 3, newest_only: bool = False, profile: bool = False) -> dict:
    """ids [T] one sequence; returns seconds per position (median of positions after the
    first, which warms the caches) and the median of each phase (decode, draft, verify).
    newest_only: the drafter drafts past step 1 only at the newest index (unroll's index),
    as a user with a drafter that is only asked about the last position would; the drafts
    are the same. profile: the two last positions run under torch.profiler, whose top ops
    (device and host self time) are returned."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    lay = layout(lay_name)
    cache = DynamicCache(config=model.config)
    sink: dict[str, torch.Tensor] = {}
    feats, clock, per_position, out = [], _Phases(), [], {}
    with hooks(model, lay.points, sink):
        model(input_ids=ids[None, :prompt_len].to(dev), past_key_values=cache, use_cache=True)
        feats.append(torch.cat([sink[p.name] for p in lay.points], dim=-1)[0])    # [P, k*H]
        for j in range(prompt_len, prompt_len + positions):
            if profile and j == prompt_len + positions - 2:
                out["profile"] = _profiled(lambda k: _position(model, drafter, embed, ids, lay, cache, sink,
                                                               feats, k, steps, newest_only, dev, clock),
                                           (j, j + 1))
                break
            t0 = time.perf_counter()
            _position(model, drafter, embed, ids, lay, cache, sink, feats, j, steps, newest_only, dev, clock)
            per_position.append(time.perf_counter() - t0)
    med = _median(per_position[1:])
    return {"positions": len(per_position), "steps": steps, "layout": lay_name, "newest_only": newest_only,
            "seconds_per_position": med, "positions_per_second": 1.0 / med, **clock.medians(), **out}


def _position(model, drafter, embed, ids, lay, cache, sink, feats, j, steps, newest_only, dev, clock):
    """One naive round at position j: decode x_j, draft `steps` tokens, verify them, crop."""
    clock.start()
    model(input_ids=ids[None, j:j + 1].to(dev), past_key_values=cache, use_cache=True)
    feats.append(torch.cat([sink[p.name] for p in lay.points], dim=-1)[0])
    clock.mark("decode")
    aux = torch.cat(feats, dim=0)[None].to(next(drafter.parameters()).dtype)   # [1, j+1, k*H]
    toks = ids[None, 1:j + 2].to(dev)
    index = torch.tensor([[j]], device=toks.device) if newest_only else None    # the newest index only
    logits = drafter.unroll(embed, aux, toks, steps, index=index)
    draft = torch.stack([drafter.ids(s[:, -1], None) for s in logits], dim=-1)  # [1, steps]
    clock.mark("draft")
    model(input_ids=draft.to(dev), past_key_values=cache, use_cache=True)
    cache.crop(-steps)  # negative: drop the verified draft again (transformers 5.x)
    clock.mark("verify")


def _profiled(fn, js) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for j in js:
            fn(j)
        sync()
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return {"positions": len(js), "top_device": _top_ops(prof, key),
            "top_host": _top_ops(prof, "self_cpu_time_total")}
