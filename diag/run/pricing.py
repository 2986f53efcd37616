"""The speedup section of a report: every evaluated shape priced with the step costs.

Pure: Evaluation records + StepCosts -> rows. The costs are either measured on the loaded
models (costs.py, basis "measured", with the spread of the timed calls) or the user's (case
[speedup], basis "user"); the section says which. DESIGN.md §6: tokens/s ~ accept_length /
(t_verify(D) + S*t_draft) vs 1/t_decode. A break-even accept length below 1 says a round costs
less than one plain decode step, which no server can do (a round verifies D >= 2 tokens): such
a row is flagged `measurement_error`, never read as a result. User costs that imply it are
refused (`check_user_costs`).
"""

from __future__ import annotations

from diag.errors import DiagError
from diag.run.speedup import StepCosts, summary


def user_costs(spec) -> StepCosts | None:
    """StepCosts from a case's [speedup] milliseconds, or None when not given."""
    if spec.t_decode_ms is None:
        return None
    try:
        verify = {int(k): float(v) / 1e3 for k, v in spec.t_verify_ms.items()}
    except (TypeError, ValueError) as err:
        raise DiagError("user verify costs are malformed", field="speedup.t_verify_ms",
                        expected='{"4" = 21.5} (D = milliseconds)', found=repr(spec.t_verify_ms)) from err
    return StepCosts(spec.t_decode_ms / 1e3, spec.t_draft_ms / 1e3, verify)


def check_user_costs(spec, source: str) -> None:
    """Verifying D >= 2 tokens costs at least one decode step: t_verify_ms[D] < t_decode_ms would
    put the break-even accept length below 1, a measurement error."""
    costs = user_costs(spec)
    low = {d: t for d, t in (costs.t_verify.items() if costs else ()) if t < costs.t_decode}
    if low:
        d = min(low)
        raise DiagError("a verify of D tokens cannot cost less than one plain decode step", file=source,
                        field=f"speedup.t_verify_ms.{d}", expected=f">= t_decode_ms = {spec.t_decode_ms}",
                        found=low[d] * 1e3, hint="the two were measured under different conditions")


def speedup_section(evaluations, costs: StepCosts, source: str, *, basis: str, spread: dict | None = None,
                    repeats: int | None = None) -> dict:
    """One row per evaluation with verify rounds, keyed and labelled like the evaluation."""
    rows = []
    for e in evaluations:
        if e.accept_length is None:
            continue
        row = summary(e.accept_length, e.shape, costs)
        row.update({"key": e.key, **e.axes.as_dict(), "num_steps": e.shape.num_steps,
                    "topk": e.shape.topk, "num_draft_tokens": e.shape.num_draft_tokens,
                    "measurement_error": row["break_even_accept_length"] < 1.0})
        rows.append(row)
    return {"source": source, "basis": basis, "costs": costs.to_dict(), "spread": spread, "repeats": repeats,
            "rows": rows}
