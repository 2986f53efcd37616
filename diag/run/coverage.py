"""Draft-vocabulary coverage: how many of the target's continuation tokens the drafter can
propose at all, and what that caps.

An EAGLE-3 drafter proposes only tokens of its hot vocabulary (t2d true; d2t maps them back).
A continuation token outside it can never be drafted, so a round's accepted drafts stop at the
first uncovered token of its window.

Ceiling, two ways:
  formula   uncovered share u spread independently over positions: a chain of depth S accepts
            at most d tokens with probability (1-u)^d, so
                ceiling(u, S) = 1 + sum_{d=1..S} (1-u)^d = 1 + (1-u)(1-(1-u)^S)/u
            worked example: u = 0.10, S = 3 -> 1 + 0.9 + 0.81 + 0.729 = 3.439
            (u = 0 gives S + 1, the most a depth-S tree can reach).
  measured  a perfect drafter that proposes the target's token whenever it is covered, run on
            the real continuations: per round the leading covered tokens of its window (at most
            S), visited as a real decode visits rounds. Clustered uncovered tokens (a word in
            another script, a run of bytes) cap less than the formula says.

Also: the share of the served drafter's rejections that fall on an uncovered token (the
rejections no training can remove without a larger hot vocabulary), the most frequent
uncovered tokens, decoded, and all of it per prompt category. The tokens checked are the
target's argmax along the continuation (what verification compares with). This module knows
token ids, t2d and statistics; nothing about models or files.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from diag.replay.replay import seq_roots
from diag.replay.round_accounting import ACCOUNTINGS, RoundAccounting
from diag.replay.verify import target_next_windows, trajectory
from diag.stats import bootstrap_ci

TOP = 10              # most frequent uncovered tokens listed


def ceiling(u: float, num_steps: int) -> float:
    """1 + sum_{d=1..S} (1-u)^d (module docstring). ceiling(0.1, 3) = 3.439."""
    return 1.0 + sum((1.0 - u) ** d for d in range(1, num_steps + 1))


def continuation_targets(tp, i: int) -> torch.Tensor:
    """[C] the target's greedy token at each continuation position of sequence i:
    argmax[prompt_len-1 .. T-2] (argmax[j] = the token after index j)."""
    s = tp.sequences[i]
    return tp.argmax[i][s.prompt_len - 1:s.emitted - 1]


def perfect_rounds(tp, i: int, covered: torch.Tensor, num_steps: int, max_steps: int,
                   accounting: RoundAccounting = ACCOUNTINGS["window"]) -> list[int]:
    """Trajectory rounds of a perfect-within-vocabulary drafter on sequence i: per root j the
    leading covered tokens of t_{j+2..j+1+S}. Roots as replay's (seq_roots under the engine's
    round accounting), so the rounds are the ones the served drafter is scored on, the last
    rounds of a request scored on the target's lookahead past its end under "to-end".
    Window [7, 3, 9] with 3 uncovered -> 1."""
    s = tp.sequences[i]
    roots = list(seq_roots(s, max_steps, accounting))
    if not roots:
        return []
    win = target_next_windows(tp.argmax[i], num_steps)[roots]                   # [R, S]
    ok = covered[win.clamp(min=0)] & (win >= 0)
    acc = ok.to(torch.int64).cumprod(-1).sum(-1)                                # [R]
    return acc[trajectory(acc)].tolist()


def rejected_uncovered(tp, evaluation, covered: torch.Tensor) -> list[tuple[int, int]]:
    """Per prompt (rejections at an uncovered token, rejections) over the evaluation's
    trajectory rounds: a round rooted at j that accepted a < S drafts was rejected at
    t_{j+2+a} = argmax[j+1+a]."""
    S = evaluation.shape.num_steps
    out = []
    for i, p in enumerate(evaluation.per_prompt):
        am, bad, total = tp.argmax[i], 0, 0
        for a, j in zip(p.accepted, p.roots):
            if a < S and j + 1 + a < len(am):
                total += 1
                bad += int(not covered[am[j + 1 + a]])
        out.append((bad, total))
    return out


def _share(pairs: list[tuple[int, int]], seed: int, n_boot: int) -> dict:
    """Pooled share Σbad / Σtotal with a bootstrap interval over prompts."""
    bad, total = sum(b for b, _ in pairs), sum(t for _, t in pairs)
    if not total:
        return {"share": None, "ci95": [None, None], "count": 0, "of": 0}
    keep = [(b, t) for b, t in pairs if t]
    lo, hi = bootstrap_ci([b / t for b, t in keep], seed=seed, n=n_boot, weights=[t for _, t in keep])
    return {"share": bad / total, "ci95": [lo, hi], "count": bad, "of": total}


def _group(tp, covered, num_steps, max_steps, idx: list[int], seed: int, n_boot: int,
           accounting: RoundAccounting) -> dict:
    pairs, rounds = [], []
    for i in idx:
        toks = continuation_targets(tp, i)
        pairs.append((int((~covered[toks]).sum()), len(toks)))
        rounds.extend(perfect_rounds(tp, i, covered, num_steps, max_steps, accounting))
    out = {"uncovered": _share(pairs, seed, n_boot)}
    u = out["uncovered"]["share"]
    out["ceiling_formula"] = None if u is None else ceiling(u, num_steps)
    out["ceiling_measured"] = 1.0 + sum(rounds) / len(rounds) if rounds else None
    return out


def coverage_section(tp, t2d: torch.Tensor, evaluation, decode: Callable[[list[int]], str], *,
                     max_steps: int, seed: int, n_boot: int,
                     accounting: RoundAccounting = ACCOUNTINGS["window"]) -> dict:
    """`tp`: the reference pass; `evaluation`: the served drafter on the trained layout and
    primary tree (its rejections are classified); `max_steps`: the run's deepest tree;
    `accounting`: the rounds the served engine counts (replay/round_accounting.py)."""
    covered = t2d.to(torch.bool).cpu()
    S = evaluation.shape.num_steps
    cats: dict[str, list[int]] = {}
    for i, s in enumerate(tp.sequences):
        cats.setdefault(s.category, []).append(i)
    counts = Counter()
    for i in range(len(tp.sequences)):
        toks = continuation_targets(tp, i)
        counts.update(toks[~covered[toks]].tolist())
    total = sum(len(continuation_targets(tp, i)) for i in range(len(tp.sequences)))
    rej = rejected_uncovered(tp, evaluation, covered)
    by_cat = {c: {"prompts": len(idx), **_group(tp, covered, S, max_steps, idx, seed, n_boot, accounting),
                  "rejected_at_uncovered": _share([rej[i] for i in idx], seed, n_boot)}
              for c, idx in sorted(cats.items())}
    return {"layout": evaluation.layout, "tree": evaluation.tree, "num_steps": S,
            "hot_vocabulary": int(covered.sum()), "vocabulary": int(covered.numel()),
            **_group(tp, covered, S, max_steps, list(range(len(tp.sequences))), seed, n_boot, accounting),
            "rejected_at_uncovered": _share(rej, seed, n_boot),
            "accept_length": evaluation.accept_length,
            "top_uncovered": [{"token": t, "text": decode([t]), "count": n, "share": n / max(total, 1)}
                              for t, n in counts.most_common(TOP)],
            "by_category": [{"category": c, **v} for c, v in by_cat.items()]}
