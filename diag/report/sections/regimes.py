"""Quantization regimes: greedy agreement, accept length and drift per capture point against
the reference regime, the cross matrix, and the drift plot."""

from __future__ import annotations

from diag.report.sections.cells import difference, f
from diag.report.views import plot_link


def regimes(rep: dict) -> list[str]:
    sec = rep.get("regimes")
    if not sec:
        return []
    ref, points = sec["reference"], sec["points"]
    out = ["## Quantization regimes", "",
           f"Against `{ref}`, over the same sequences; accept length of `{sec['layout']}` on {sec['tree']}. "
           "Drift per capture point: mean cosine / relative L2.", "",
           "| regime | greedy agreement | accept length | vs reference [95% CI] | "
           + " | ".join(f"`{p}`" for p in points) + " |", "|---" * (4 + len(points)) + "|"]
    for r in sec["regimes"]:
        vs_cell = difference(r.get("vs_reference"))
        cells = [f"{f(r['drift'][p]['cosine'], 3)} / {f(r['drift'][p]['relative_l2'], 3)}" for p in points]
        out.append(f"| {r['regime']} | {f(r['argmax_agreement'], 3)} | {f(r.get('accept_length'))} | "
                   f"{vs_cell} | " + " | ".join(cells) + " |")
    if sec.get("cross"):
        out += ["", "Cross matrix (features from one regime, verifying tokens from another): "
                + ", ".join(f"{c['features']}→{c['tokens']}: {f(c['accept_length'])}" for c in sec["cross"])]
    return out + ["", *plot_link(rep, "drift.png"), ""]
