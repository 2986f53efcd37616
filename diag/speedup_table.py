"""The speedup section of a report: every evaluated shape priced with the step costs.

Pure: evaluations (results.summarize dicts) + StepCosts -> rows. The costs are either
measured on the loaded models (costs.py) or the user's (case [speedup]); the section says
which. DESIGN.md §6: tokens/s ~ accept_length / (t_verify(D) + S*t_draft) vs 1/t_decode.
"""

from __future__ import annotations

from diag.speedup import StepCosts, summary
from diag.trees import TreeShape


def user_costs(spec) -> StepCosts | None:
    """StepCosts from a case's [speedup] milliseconds, or None when not given."""
    if spec.t_decode_ms is None:
        return None
    return StepCosts(spec.t_decode_ms / 1e3, spec.t_draft_ms / 1e3,
                     {int(k): float(v) / 1e3 for k, v in spec.t_verify_ms.items()})


def speedup_section(evaluations: list[dict], costs: StepCosts, source: str) -> dict:
    rows = []
    for e in evaluations:
        shape = TreeShape(e["num_steps"], e["topk"], e["num_draft_tokens"])
        row = summary(e["accept_length"], shape, costs)
        row.update({"key": e["key"], "layout": e["layout"], "mode": e["mode"], "tree": e["tree"],
                    "regime": e["regime"], "tokens_regime": e["tokens_regime"],
                    "num_steps": shape.num_steps, "topk": shape.topk,
                    "num_draft_tokens": shape.num_draft_tokens})
        rows.append(row)
    return {"source": source, "costs": costs.to_dict(), "rows": rows}
