"""The engines compared from one target pass (report.json `engines`, present only when a run
compares engines): per engine, the layout it feeds, its accept length on the reference tree and
the difference from the trained layout's."""

from __future__ import annotations

from diag.report.sections.cells import f


def engines(rep: dict) -> list[str]:
    sec = rep.get("engines")
    if not sec:
        return []
    out = ["## Engines compared", "",
           f"Each engine's served layout, from the same target pass; accept length on {sec['tree']}, against the "
           f"trained `{sec['trained_layout']}` ({f(sec['trained_accept_length'])}).", "",
           "| engine | served layout | accept length [95% CI] | vs trained | as trained |", "|---|---|---|---|---|"]
    for r in sec["rows"]:
        ci = "" if r["accept_length_ci95"] is None else f" [{f(r['accept_length_ci95'][0])}, {f(r['accept_length_ci95'][1])}]"
        served = "–" if r["served"] is None else f"`{r['served']}` ({r['mode']})"
        vs = "–" if r["difference"] is None else f"{r['difference']:+.2f}"
        out.append(f"| {r['label']} | {served} | {f(r['accept_length'])}{ci} | {vs} | {'yes' if r['as_trained'] else 'no'} |")
    notes = [f"- {r['label']}: {r['rule']}" for r in sec["rows"]]
    return out + ["", *notes, ""]
