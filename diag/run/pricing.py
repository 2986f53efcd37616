"""The speedup section of a report: every evaluated shape priced with the step costs.

Pure: Evaluation records + StepCosts -> rows. The costs are either
measured on the loaded models (costs.py) or the user's (case [speedup]); the section says
which. DESIGN.md §6: tokens/s ~ accept_length / (t_verify(D) + S*t_draft) vs 1/t_decode.
"""

from __future__ import annotations

from diag.run.speedup import StepCosts, summary


def user_costs(spec) -> StepCosts | None:
    """StepCosts from a case's [speedup] milliseconds, or None when not given."""
    if spec.t_decode_ms is None:
        return None
    return StepCosts(spec.t_decode_ms / 1e3, spec.t_draft_ms / 1e3,
                     {int(k): float(v) / 1e3 for k, v in spec.t_verify_ms.items()})


def speedup_section(evaluations, costs: StepCosts, source: str) -> dict:
    """One row per evaluation with verify rounds, keyed and labelled like the evaluation."""
    rows = []
    for e in evaluations:
        if e.accept_length is None:
            continue
        row = summary(e.accept_length, e.shape, costs)
        row.update({"key": e.key, **e.axes.as_dict(), "num_steps": e.shape.num_steps,
                    "topk": e.shape.topk, "num_draft_tokens": e.shape.num_draft_tokens})
        rows.append(row)
    return {"source": source, "costs": costs.to_dict(), "rows": rows}
