"""The quantization section of a report (DESIGN.md §7): how far each regime moved the
target's states and answers, and what that cost the drafter.

Per regime, against the reference regime, over the same sequences:
  drift at every captured point (mean per-token cosine, relative L2 over all tokens),
  greedy-token agreement (fraction of positions whose argmax is unchanged),
  accept length on the trained layout (the best eagle3 candidate) and primary tree;
and the cross matrix: accept length with the drafter's features from regime A and the
verifying tokens from regime B, which separates "the drafter's inputs moved" (A varies,
B fixed) from "the target's answers moved" (B varies, A fixed).

A regime named "ckpt:PATH" is another checkpoint of the same model (e.g. the BF16 original
of an INT4 target). This module reads TargetPasses and Evaluation records; no models, no files.
"""

from __future__ import annotations

import torch

from diag.target.drift import drift
from diag.replay.evaluation import Axes, one
from diag.stats import paired_bootstrap_diff
from diag.target.passes import TargetPass


def _flat(tp: TargetPass, name: str) -> torch.Tensor:
    return torch.cat([s.float() for s in tp.states[name]], dim=0)                # [sum T, H]


def argmax_agreement(ref: TargetPass, other: TargetPass) -> float:
    """Fraction of positions (prompt and continuation) where both regimes' greedy token agree."""
    hit = sum(int((a == b).sum()) for a, b in zip(ref.argmax, other.argmax))
    return hit / max(sum(len(a) for a in ref.argmax), 1)


def drift_table(ref: TargetPass, other: TargetPass, points: list[str]) -> dict[str, dict]:
    d = drift({p: _flat(ref, p) for p in points}, {p: _flat(other, p) for p in points})
    return {p: {"cosine": float(v.cosine_mean), "relative_l2": float(v.relative_l2)} for p, v in d.items()}


def regime_section(passes: dict[str, TargetPass], reference: str, evals, where: Axes, layout: str | None,
                   *, seed: int, n_boot: int) -> dict | None:
    """`where`: the run's reference axes; rows are read at layout `layout` (the trained one)."""
    regimes = list(passes)
    if len(regimes) < 2 or layout is None:
        return None
    ref = passes[reference]
    points = sorted(ref.states, key=_point_order)
    at = where.but(layout=layout)
    base = one(evals, at, regime=reference, tokens_regime=reference)
    rows = []
    for r in regimes:
        row = {"regime": r, "argmax_agreement": argmax_agreement(ref, passes[r]),
               "drift": drift_table(ref, passes[r], points)}
        own = one(evals, at, regime=r, tokens_regime=r)
        if own is not None:
            row["accept_length"], row["accept_length_ci95"] = own.accept_length, list(own.accept_length_ci95)
            if base is not None and r != reference:
                d, lo, hi = paired_bootstrap_diff(own.trajectory_rounds, base.trajectory_rounds,
                                                  seed=seed, n=n_boot)
                row["vs_reference"] = {"difference": d, "ci95": [lo, hi]}
        rows.append(row)
    cross = [{"features": a, "tokens": b, "accept_length": e.accept_length}
             for a in regimes for b in regimes if (e := one(evals, at, regime=a, tokens_regime=b)) is not None]
    return {"reference": reference, "layout": layout, "tree": where.tree, "points": points, "regimes": rows,
            "cross": cross}


def _point_order(name: str) -> int:
    if name == "embed":
        return 0
    if name == "final":
        return 10 ** 6
    return int(name[1:])
