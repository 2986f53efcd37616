"""Will speculation pay? The step costs, then one row per tree shape: its round cost and
break-even accept length, and each variant's accept length and predicted speedup at the
reference regime; the plot of accept length against break-even."""

from __future__ import annotations

from diag.report.sections.cells import f, header, row
from diag.report.views import plot_link, primary_rows, tree_order


def speedup(rep: dict) -> list[str]:
    sp = rep.get("speedup")
    if not sp or not sp.get("rows"):
        return []
    c = sp["costs"]
    verify = ", ".join(f"D={d}: {t * 1e3:.2f} ms" for d, t in c["t_verify"].items())
    variants = [(e["layout"], e["mode"]) for e in primary_rows(rep)]
    ref = (rep.get("reference") or {}).get("regime")
    by = {(r["tree"], r["layout"], r["mode"]): r for r in sp["rows"]
          if r["regime"] == r["tokens_regime"] == ref}
    out = ["## Will speculation pay?", "",
           f"Step costs ({sp['source']}): decode {c['t_decode'] * 1e3:.2f} ms, draft step "
           f"{c['t_draft'] * 1e3:.2f} ms, draft extend {c['t_draft_extend'] * 1e3:.2f} ms, verify {verify}. "
           "Break-even accept length = round cost / decode cost; above it speculation beats plain "
           f"decoding. Cells: accept length → predicted speedup, at regime {ref}." + _spread(sp), "",
           *header(["tree", "round cost", "break-even", *[f"`{lay}` {mode}" for lay, mode in variants]])]
    for tree in tree_order(rep):
        cells = [by.get((tree, lay, mode)) for lay, mode in variants]
        first = next((r for r in cells if r is not None), None)
        if first is None:
            continue
        even = "measurement error" if first.get("measurement_error") else f(first["break_even_accept_length"])
        out.append(row([tree, f"{first['round_cost_s'] * 1e3:.2f} ms",
                        even + ("" if first["break_even_reachable"] else " (unreachable)"),
                        *["" if r is None else f"{f(r.get('accept_length'))} → {f(r.get('speedup'))}x"
                          for r in cells]]))
    return out + ["", *plot_link(rep, "speedup.png"), ""]


def _spread(sp: dict) -> str:
    """Measured costs: a measurement with its spread, never a verdict."""
    if sp.get("basis") != "measured" or not sp.get("spread"):
        return ""
    d = sp["spread"]["t_decode"]
    return (f" Measured on this machine, {sp['repeats']} calls each (decode {d['min'] * 1e3:.2f} / "
            f"{d['median'] * 1e3:.2f} / {d['max'] * 1e3:.2f} ms min / median / max): a measurement, not a verdict "
            "on your server. A break-even below 1 (a round cheaper than a plain step) is a measurement error.")
