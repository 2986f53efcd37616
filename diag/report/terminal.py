"""The one-screen summary on the terminal: the verdicts, wrapped to the width, then one table
of the primary tree (every candidate layout and serving mode at the reference regime, the
rows report.md's first table shows). About 30 lines for the demo; the rest is in report.md.

Reads the report dict only, like the Markdown.
"""

from __future__ import annotations

import textwrap

from diag.report.views import primary_rows, primary_tree, tag

WIDTH = 100


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def _verdict_lines(rep: dict, width: int) -> list[str]:
    out = []
    for v in rep["verdicts"]:
        head = f"[{v['severity'].upper()}] "
        out += textwrap.wrap(v["text"], width=width, initial_indent=head,
                             subsequent_indent=" " * len(head), break_on_hyphens=False)
    return out


def _table(rep: dict) -> list[str]:
    rows = primary_rows(rep)
    if not rows:
        return ["no variant on the primary tree produced verify rounds"]
    lay = max(8, *(len(e["layout"]) for e in rows))
    dec = (rep.get("reference") or {}).get("decoding", "greedy")
    under = "" if dec == "greedy" else f" under sampled decoding {dec}"
    out = [f"accept length on {primary_tree(rep)}{under} (bonus included, over the rounds a real decode visits):",
           f"  {'layout':{lay}} {'mode':6} {'role':20} {'acc.len':>7} {'95% CI':>11}  P(a>=d), d=1.."]
    for e in rows:
        lo, hi = e["accept_length_ci95"]
        ci = "–" if lo is None else f"{lo:.2f}-{hi:.2f}"
        depth = " ".join(_f(x) for x in e["trajectory"]["acceptance_at_depth"])
        out.append(f"  {e['layout']:{lay}} {e['mode']:6} {tag(rep, e):20} {_f(e['accept_length']):>7} "
                   f"{ci:>11}  {depth}")
    return out


def summary_table(rep: dict, width: int = WIDTH) -> str:
    lines = [f"diag: {rep['case']['name']}  ({rep['prompts']['count']} prompts, "
             f"{rep['target_pass']['continuation_tokens']} continuation tokens)", ""]
    lines += _verdict_lines(rep, width) + [""] + _table(rep)
    return "\n".join(lines)
