"""Decode-loop rounds -> Evaluation records: the Monte-Carlo accept length and the exact
per-round expectation, each with a 95% interval over prompts (DESIGN.md §11).

For one variant and decoding, every seed's rounds of a prompt are pooled into that prompt's
PromptRounds (the prompt stays the unit of resampling, stats.py). Per visited round the loop
recorded a (accepted drafts) and P(a >= d) for d = 1..S under the round's own tree and target
probabilities; E[a | round] = sum_d P(a >= d) (thresholds 1: sum over tree nodes of the product
of p along the path). Then
    Monte-Carlo accept length = 1 + sum a / rounds
    exact accept length       = 1 + sum E[a | round] / rounds
The exact one has no coin noise of its own (only the trajectory, which the coins also drive,
varies); both are averages over the same rounds, so they agree within the Monte-Carlo interval.
Worked example: rounds a = [2, 0], P(a >= d) = [[.9, .6], [.5, .1]] -> Monte-Carlo 2.0,
exact 1 + (1.5 + .6) / 2 = 2.05.

The loop visits only trajectory rounds, so `all_positions` equals `trajectory` here. This
module knows rounds and statistics; nothing about models or files.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from diag.metrics import AcceptCounts
from diag.replay.decode_rows import Decoded
from diag.replay.evaluation import Evaluation, PromptRounds, _buckets
from diag.replay.replay import Variant
from diag.replay.round_accounting import ACCOUNTINGS, RoundAccounting
from diag.stats import accept_length_ci


def _pooled(decoded: list[Decoded], prompt_lens: list[int], window_steps: int,
            accounting: RoundAccounting) -> dict[int, dict]:
    """prompt -> the rounds the engine counts of every seed (seed order), as parallel lists."""
    by_prompt: dict[int, dict] = defaultdict(lambda: {"a": [], "roots": [], "depth": [], "seeds": []})
    for o in sorted(decoded, key=lambda o: (o.prompt, o.lane.seed)):
        keep = o.rounds_counted(prompt_lens[o.prompt], window_steps, accounting)
        rec = by_prompt[o.prompt]
        rec["a"] += [o.accepted[i] for i in keep]
        rec["roots"] += [o.roots[i] for i in keep]
        rec["depth"] += [o.expected[i] for i in keep]
        rec["seeds"] += [o.lane.seed] * len(keep)
    return by_prompt


def summarize_sampled(variant: Variant, decoded: list[Decoded], prompt_ids: list[str], prompt_lens: list[int],
                      *, window_steps: int, buckets: tuple[int, ...], seed: int, n_boot: int,
                      accounting: RoundAccounting = ACCOUNTINGS["window"]) -> Evaluation:
    """One variant's rounds (all seeds, all prompts) -> its Evaluation at variant.decoding;
    `accounting`: which rounds of each request the engine counts (replay/round_accounting.py)."""
    S, D = variant.tree.num_steps, variant.tree.num_draft_tokens
    pooled = _pooled(decoded, prompt_lens, window_steps, accounting)
    per_prompt = tuple(PromptRounds(pid, tuple(pooled[i]["a"]), tuple(pooled[i]["roots"]),
                                    expected=tuple(float(sum(r)) for r in pooled[i]["depth"]),
                                    seeds=tuple(pooled[i]["seeds"]))
                       for i, pid in enumerate(prompt_ids))
    all_a = [a for p in per_prompt for a in p.accepted]
    counts = AcceptCounts.from_accepted(all_a, S, D)
    mc = exact = (None, None, None)
    depth: tuple[float, ...] = ()
    if counts.rounds:
        mc = accept_length_ci([p.accepted for p in per_prompt], seed=seed, n=n_boot)
        exact = accept_length_ci([p.expected for p in per_prompt], seed=seed, n=n_boot)
        rows = torch.tensor([r for i in pooled for r in pooled[i]["depth"]], dtype=torch.float64)
        depth = tuple(float(x) for x in rows.mean(0))
    roots = torch.tensor([j for p in per_prompt for j in p.roots], dtype=torch.long)
    by_pos = _buckets(torch.tensor(all_a, dtype=torch.long), roots, buckets, S, D)
    seeds = tuple(sorted({o.lane.seed for o in decoded}))
    return Evaluation(variant.axes, variant.tree, counts, counts, mc[0], (mc[1], mc[2]), by_pos, per_prompt,
                      expected_accept_length=exact[0], expected_accept_length_ci95=(exact[1], exact[2]),
                      expected_acceptance_at_depth=depth, seeds=seeds)
