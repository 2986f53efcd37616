"""From per-round accepted counts to the numbers a report carries (plain dicts).

For each variant: counts over all rounds and over the simulated decode trajectory
(DESIGN.md §4.5), their metrics (metrics.summary), the trajectory accept length with a
bootstrap 95% interval over prompts, acceptance by position bucket, and the per-prompt
trajectory rounds that paired comparisons resample. This module knows counts and
statistics; it knows nothing about models, files or Markdown.
"""

from __future__ import annotations

import torch

from diag.metrics import AcceptCounts, bucketed, summary
from diag.replay import VariantResult
from diag.stats import accept_length_ci
from diag.verify import trajectory


def trajectory_rounds(res: VariantResult) -> tuple[list[list[int]], list[list[int]]]:
    """Per prompt, the rounds a real decode would visit: (accepted counts, root positions)."""
    counts, roots = [], []
    for acc, pos in zip(res.accepted, res.roots):
        visit = trajectory(acc) if acc.numel() else torch.zeros(0, dtype=torch.long)
        counts.append(acc[visit].tolist())
        roots.append(pos[visit].tolist())
    return counts, roots


def summarize(res: VariantResult, *, buckets: tuple[int, ...], seed: int, n_boot: int) -> dict:
    v = res.variant
    S, D = v.tree.num_steps, v.tree.num_draft_tokens
    all_acc = torch.cat(res.accepted) if res.accepted else torch.zeros(0, dtype=torch.long)
    roots = torch.cat(res.roots) if res.roots else torch.zeros(0, dtype=torch.long)
    traj, traj_roots = trajectory_rounds(res)
    traj_counts = AcceptCounts.from_accepted([a for r in traj for a in r], S, D)
    point, lo, hi = accept_length_ci(traj, seed=seed, n=n_boot) if traj_counts.rounds else (None, None, None)
    edges = [e for e in buckets if e <= int(roots.max()) + 1] if roots.numel() else []
    edges = edges + [max(int(roots.max()) + 1, edges[-1] + 1)] if edges else []
    by_pos = bucketed(all_acc, roots, edges, num_steps=S, num_draft_tokens=D) if len(edges) >= 2 else []
    return {
        "key": v.key, "layout": v.layout, "mode": v.mode, "tree": v.tree.name,
        "num_steps": S, "topk": v.tree.topk, "num_draft_tokens": D,
        "regime": v.regime, "tokens_regime": v.tokens_regime,
        "all_positions": summary(AcceptCounts.from_accepted(all_acc, S, D)),
        "trajectory": summary(traj_counts),
        "accept_length_ci95": [lo, hi],
        "accept_length": point,
        "by_position": [{"from": lo_e, "to": hi_e, **summary(c)} for (lo_e, hi_e), c in
                        zip(zip(edges, edges[1:]), by_pos)],
        "per_prompt": [{"id": pid, "rounds": len(r), "accepted_sum": int(sum(r))}
                       for pid, r in zip(res.prompt_ids, traj)],
        "trajectory_rounds": traj,
        "trajectory_roots": traj_roots,
    }
