"""The tree-choice verdict: the best tree shape for the trained layout at the run's step
costs, and whether speculation pays at all (its break-even accept length, DESIGN.md §6).

Reads Evaluation records and the speedup section's rows (keyed like the evaluations).
"""

from __future__ import annotations

from diag.replay.evaluation import ANY, select
from diag.run.verdicts.record import Verdict, fmt


def speedup_verdicts(run) -> list[Verdict]:
    sp, lay = run.speedup, run.best_layout()
    if not sp or lay is None:
        return []
    by_key = {r["key"]: r for r in sp["rows"]}
    rows = [by_key[e.key] for e in select(run.evaluations, run.reference, layout=lay, tree=ANY)
            if e.key in by_key and by_key[e.key].get("speedup") is not None]
    if not rows:
        return []
    top = max(rows, key=lambda r: r["speedup"])
    ev = {"layout": lay, "best": top, "costs": sp["costs"], "costs_source": sp["source"],
          "shapes": [(r["tree"], r["accept_length"], r["speedup"], r["break_even_accept_length"]) for r in rows]}
    core = (f"{top['tree']} (S={top['num_steps']}, K={top['topk']}, D={top['num_draft_tokens']}) on "
            f"{lay}: accept length {fmt(top['accept_length'])}, break-even "
            f"{fmt(top['break_even_accept_length'])}, predicted {top['speedup']:.2f}x plain decoding "
            f"(costs {sp['source']}).")
    if top["speedup"] < 1.0:
        text = (f"SPECULATION DOES NOT PAY at these step costs: even the best of {len(rows)} shapes, {core} "
                f"Every shape needs a higher accept length than the drafter reaches.")
        return [Verdict("speedup", "warning", text, ev)]
    return [Verdict("tree-choice", "info", f"Best tree shape of {len(rows)} evaluated: {core}", ev)]
