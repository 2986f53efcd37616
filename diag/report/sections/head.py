"""The first screen of report.md: the title, the verdicts, and one table of the primary tree
(every candidate layout and serving mode), what a ticket reader needs before anything else."""

from __future__ import annotations

from diag.engines import report_rates, report_rates_texts
from diag.report.sections.cells import ICON, ci, f, header, row
from diag.report.views import primary_rows, primary_tree, tag


def title(rep: dict) -> list[str]:
    out = [f"# diag report: {rep['case']['name']}", ""]
    return out + ([rep["case"]["description"], ""] if rep["case"]["description"] else [])


def verdicts(rep: dict) -> list[str]:
    out = ["## Verdicts", ""]
    if not rep["verdicts"]:
        out.append("No verdict: no candidate produced verify rounds.")
    for v in rep["verdicts"]:
        out.append(f"- {ICON[v['severity']]} **{v['severity'].upper()}** — {v['text']}")
    return out + [""]


def primary_table(rep: dict) -> list[str]:
    rows = primary_rows(rep)
    if not rows:
        return []
    tree, rates = primary_tree(rep), report_rates()
    out = [f"## Accept length on {tree}", "",
           f"1 + mean accepted drafts per verify round (bonus token included), over the rounds a real "
           f"decode visits; 95% CI by bootstrap over {rep['prompts']['count']} prompts. `all pos.`: over "
           "every position" + "".join(f"; {t}" for t in report_rates_texts()) + ".", "",
           *header(["layout", "mode", "role", "accept length", "95% CI", "all pos.", *(r.column for r in rates),
                    "P(a≥d), d=1.."])]
    for e in rows:
        tr, al = e["trajectory"], e["all_positions"]
        out.append(row([f"`{e['layout']}`", e["mode"], tag(rep, e), f"**{f(e['accept_length'])}**",
                        ci(e["accept_length_ci95"]), f(al["accept_length"]), *(f(tr[r.field]) for r in rates),
                        " ".join(f(x) for x in tr["acceptance_at_depth"])]))
    return out + [""]
