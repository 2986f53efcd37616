"""The one-screen summary on the terminal: verdicts, then one line per variant.

Reads the report dict only, like the Markdown.
"""

from __future__ import annotations


def _f(x) -> str:
    return "  –  " if x is None else f"{x:5.2f}"


def summary_table(rep: dict, max_rows: int = 24) -> str:
    lines = [f"diag: {rep['case']['name']}  ({rep['prompts']['count']} prompts, "
             f"{rep['target_pass']['continuation_tokens']} continuation tokens)", ""]
    for v in rep["verdicts"]:
        lines.append(f"[{v['severity'].upper()}] {v['text']}")
    lines += ["", f"{'layout':28} {'mode':6} {'tree':10} {'regime@decoding':24} {'acc.len':>7} {'95% CI':>13} "
                  f"{'all pos':>7}  P(a>=d)"]
    evals = sorted(rep["evaluations"], key=lambda e: -(e["accept_length"] or 0))
    for e in evals[:max_rows]:
        lo, hi = e["accept_length_ci95"]
        ci = "      –      " if lo is None else f"{lo:5.2f}-{hi:5.2f}".rjust(13)
        reg = e["regime"] if e["regime"] == e["tokens_regime"] else f"{e['regime']}>{e['tokens_regime']}"
        reg += "" if e.get("decoding", "greedy") == "greedy" else f"@{e['decoding']}"
        depth = " ".join(_f(x).strip() for x in e["all_positions"]["acceptance_at_depth"])
        lines.append(f"{e['layout'][:28]:28} {e['mode']:6} {e['tree'][:10]:10} {reg[:24]:24} "
                     f"{_f(e['accept_length']):>7} {ci} {_f(e['all_positions']['accept_length']):>7}  {depth}")
    if len(evals) > max_rows:
        lines.append(f"... {len(evals) - max_rows} more rows in report.md")
    return "\n".join(lines)
