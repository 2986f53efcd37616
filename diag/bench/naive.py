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


@torch.no_grad()
def naive_loop(model, drafter, embed, ids: torch.Tensor, lay_name: str, *, prompt_len: int,
               positions: int, steps: int = 3) -> dict:
    """ids [T] one sequence; returns seconds per position (median of positions after the
    first, which warms the caches)."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    lay = layout(lay_name)
    cache = DynamicCache(config=model.config)
    sink: dict[str, torch.Tensor] = {}
    feats = []
    with hooks(model, lay.points, sink):
        model(input_ids=ids[None, :prompt_len].to(dev), past_key_values=cache, use_cache=True)
        feats.append(torch.cat([sink[p.name] for p in lay.points], dim=-1)[0])    # [P, k*H]
        per_position = []
        for j in range(prompt_len, prompt_len + positions):
            sync()
            t0 = time.perf_counter()
            model(input_ids=ids[None, j:j + 1].to(dev), past_key_values=cache, use_cache=True)
            feats.append(torch.cat([sink[p.name] for p in lay.points], dim=-1)[0])
            aux = torch.cat(feats, dim=0)[None].to(next(drafter.parameters()).dtype)  # [1, j+1, k*H]
            toks = ids[None, 1:j + 2].to(dev)
            logits = drafter.unroll(embed, aux, toks, steps)
            draft = torch.stack([drafter.ids(s[:, -1], None) for s in logits], dim=-1)  # [1, steps]
            model(input_ids=draft.to(dev), past_key_values=cache, use_cache=True)
            cache.crop(-steps)  # negative: drop the verified draft again (transformers 5.x)
            sync()
            per_position.append(time.perf_counter() - t0)
    med = sorted(per_position[1:])[len(per_position[1:]) // 2]
    return {"positions": positions, "steps": steps, "layout": lay_name,
            "seconds_per_position": med, "positions_per_second": 1.0 / med}
