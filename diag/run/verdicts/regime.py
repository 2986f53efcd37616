"""Quantization verdicts (DESIGN.md §7): per regime, accept length against the reference with
its interval; where the states moved (the most drifted capture point of the layout); and,
with the cross matrix, whether the drafter's inputs or the target's answers moved.

Reads the regimes section (regime_section.py); knows nothing about models or files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt


def _worst_drift(row: dict, layout: str) -> tuple[str, dict]:
    pts = [p for p in layout.split("+") if p in row["drift"]] or list(row["drift"])
    worst = min(pts, key=lambda p: row["drift"][p]["cosine"])
    return worst, row["drift"][worst]


def _cross(sec: dict, feats: str, toks: str):
    return next((c["accept_length"] for c in sec["cross"] if (c["features"], c["tokens"]) == (feats, toks)), None)


def regime_verdicts(run) -> list[Verdict]:
    sec = run.regimes
    if not sec:
        return []
    ref, lay, out = sec["reference"], sec["layout"], []
    for row in sec["regimes"]:
        if row["regime"] == ref or "vs_reference" not in row:
            continue
        d, (lo, hi) = row["vs_reference"]["difference"], row["vs_reference"]["ci95"]
        point, dr = _worst_drift(row, lay)
        text = (f"Regime {row['regime']} vs {ref}: accept length {fmt(row['accept_length'])} vs "
                f"{fmt(_cross(sec, ref, ref))} on {lay}, {sec['tree']} (difference {d:+.2f}, 95% CI "
                f"[{lo:+.2f}, {hi:+.2f}]); greedy tokens agree at {row['argmax_agreement']:.1%} of positions; "
                f"largest drift of the layout's points at {point} (cosine {dr['cosine']:.4f}, relative L2 "
                f"{dr['relative_l2']:.3f}).")
        inputs, answers = _cross(sec, row["regime"], ref), _cross(sec, ref, row["regime"])
        if inputs is not None and answers is not None:
            text += (f" Cross matrix: drafter inputs from {row['regime']} with {ref}'s tokens give "
                     f"{fmt(inputs)} (the inputs moved); {ref}'s inputs with {row['regime']}'s tokens give "
                     f"{fmt(answers)} (the answers moved).")
        out.append(Verdict("quantization", "warning" if hi < 0 else "info", text, row))
    return out
