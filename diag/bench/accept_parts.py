"""Where the sampled accept step's time goes at Kimi's vocabulary: `accept_dense` (the decode loop's
accept on fixed shapes) and its parts, each timed alone, on the logits in float32 and in the head's
bf16 (what the loop hands it since the thirty-seventh stop), per tree shape. No checkpoint: the
logits are synthetic, sized as the sampled section's rounds (96 rows x a tree's nodes x 163,840
ids), each node's distribution one spiked id over N(0, 1) logits (spike 15.5-22: from a top-p 0.95
pivot among the first few ids to one near the window's edge), 1/32 of the nodes flat (their pivot
past the top-p window: sorted whole, or more than the capacity and `ok` False), and each node's
token its parent's spike (walks go deep).

Parts (milliseconds, bench/common.timed: the median of `reps` runs on CUDA, 3 on the CPU, each
synchronised, eagerly: a graph replays the same kernels without their launches):
  accept_dense      the whole step, unsynced (the graphs' way)
  tempered          softmax(logits / T) in float32 (`_tempered`), widening bf16 logits first
  top_p_kept        the top-p pivot: the window over the key's top 256, then the capacity rows
                    sorted whole (`top_p_kept` with a capacity, as the graphs run it)
  window_topk       the window's top-k over the logits alone
  capacity_sort     the capacity rows' whole sort alone
  bonus             the bonus: the last node's renormalised row drawn from (`draw_bonus`)
Worked example (H200, s3-k8-d16, float32 / bf16): accept_dense 7.03 / 6.42, tempered 1.00 / 1.70,
window_topk 2.94 / 1.91, capacity_sort 1.12 / 1.07 (reports/bench/NOTES.md, thirty-seventh stop).
This module knows the accept step and clocks; nothing about models or files.
"""

from __future__ import annotations

import torch

from diag.bench.common import timed
from diag.engines.decoding import sampled
from diag.replay.accept import accept_dense
from diag.replay.sampling import (DEEPER_MIN, DEEPER_ROWS, _tempered, coins_at, draw_bonus, target_kept,
                                  top_p_kept)
from diag.replay.verifiers import sampled_rule
from diag.trees import tree_shape

DECODING = sampled(1.0, 0.95)
TREES = ("chain-1", "s3-k8-d16")          # the sampled section's two unmet ends: fewest and most nodes
FLAT_SHARE = 1 / 32


def _parents(B: int, D: int, S: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain when D = S + 1, else each node's parent drawn among the earlier nodes of depth < S:
    (parents, depths) [B, D]."""
    if D == S + 1:
        return torch.arange(-1, D - 1).expand(B, D).clone(), torch.arange(D).expand(B, D).clone()
    parents = torch.full((B, D), -1, dtype=torch.long)
    depths = torch.zeros(B, D, dtype=torch.long)
    for i in range(1, D):
        pick = torch.randint(0, i, (B,), generator=g)
        pick = torch.where(depths.gather(1, pick[:, None])[:, 0] < S, pick, torch.zeros_like(pick))
        parents[:, i] = pick
        depths[:, i] = depths.gather(1, pick[:, None])[:, 0] + 1
    return parents, depths


def synthetic_round(tree: str, rows: int, vocab: int, dtype: torch.dtype, device, seed: int = 1):
    """(t, logits [rows, D, vocab] in dtype, coins [rows, D + 1], S) as the module docstring draws them."""
    shape = tree_shape(tree)
    D, S = shape.num_draft_tokens, shape.num_steps
    g = torch.Generator().manual_seed(seed)
    parents, depths = _parents(rows, D, S, g)
    logits = torch.randn(rows, D, vocab, generator=g)
    spike = torch.randint(0, vocab, (rows, D), generator=g)
    height = 15.5 + 6.5 * torch.rand(rows, D, generator=g)
    height = torch.where(torch.rand(rows, D, generator=g) < FLAT_SHARE, torch.zeros_like(height), height)
    logits.scatter_add_(-1, spike[..., None], height[..., None])
    tokens = spike.gather(1, parents.clamp(min=0))
    t = {"tokens": tokens.to(device), "parents": parents.to(device), "depths": depths.to(device),
         "valid": torch.ones(rows, D, dtype=torch.bool, device=device)}
    coins = coins_at(torch.arange(rows, device=device), torch.zeros(rows, dtype=torch.long, device=device), D + 1)
    return t, logits.to(device, dtype), coins, S


@torch.no_grad()
def accept_parts(*, device: str = "cuda", trees=TREES, rows: int = 96, vocab: int = 163840,
                 dtypes=("float32", "bfloat16"), reps: int = 20) -> dict:
    """Each tree x logits dtype: the parts' milliseconds (module docstring) and ok (every top-p
    pivot within what the capacity searched)."""
    cuda = torch.device(device).type == "cuda"
    rule = sampled_rule("tree-target-only")
    out = []
    for tree in trees:
        for name in dtypes:
            t, logits, coins, S = synthetic_round(tree, rows, vocab, getattr(torch, name), device)
            B, D, V = logits.shape
            flat = logits.reshape(-1, V)
            p = _tempered(flat, DECODING)
            cap = max(DEEPER_MIN, int(len(p) * DEEPER_ROWS))
            kept, ok = target_kept(logits, DECODING, unsynced=True)
            last = torch.arange(B, device=logits.device) * D
            none = torch.zeros(B, D, dtype=torch.bool, device=logits.device)
            parts = {
                "accept_dense": lambda: accept_dense(rule, t, logits, DECODING, coins, S, unsynced=True),
                "tempered": lambda: _tempered(flat, DECODING),
                "top_p_kept": lambda: top_p_kept(p, DECODING.top_p, capacity=cap, key=flat),
                "window_topk": lambda: torch.topk(flat, 256, dim=-1),
                "capacity_sort": lambda: torch.sort(p[:cap], dim=-1),
                "bonus": lambda: draw_bonus(kept.whole(last), t["tokens"], none, coins[:, D]),
            }
            ms = {k: round(timed(fn, repeat=reps if cuda else 3) * 1e3, 4) for k, fn in parts.items()}
            out.append({"tree": tree, "logits": name, "rows": B, "nodes": D, "vocab": V, "capacity_rows": cap,
                        "ok": bool(ok), "ms": ms})
    return {"decoding": DECODING.name, "flat_share": FLAT_SHARE,
            "timing": f"bench.common.timed: median of {reps if cuda else 3}, synchronised", "rows": out}
