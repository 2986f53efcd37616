"""The speedup section of a report: every evaluated shape priced with the step costs.

Pure: Evaluation records + StepCosts -> a SpeedupSection. The costs are either measured on the
loaded models (costs.py, basis "measured", with the spread of the timed calls) or the user's
(case [speedup], basis "user"); the section says which. DESIGN.md §6: tokens/s ~ accept_length /
(t_verify(D) + S*t_draft) vs 1/t_decode. A break-even accept length below 1 says a round costs
less than one plain decode step, which no server can do (a round verifies D >= 2 tokens): such
a row is flagged `measurement_error`, never read as a result (run/case_checks.check_user_costs
refuses user costs that imply it).

report.json (field order is the key order), e.g. one row of the demo on chain-3:
    {"shape": "chain-3", "round_cost_s": 0.00599, "t_verify_s": 0.00358, "t_verify_measured": true,
     "break_even_accept_length": 2.03, "break_even_reachable": true, "max_speedup": 1.97,
     "plain_tokens_per_second": 339.6, "accept_length": 3.09, "speedup": 1.52,
     "tokens_per_second": 516.1, "key": "embed+L2+L4|eagle3|chain-3|as-loaded", "layout": ...,
     "mode", "tree", "regime", "tokens_regime", "rendering", "decoding" (the axes),
     "num_steps": 3, "topk": 1, "num_draft_tokens": 4, "measurement_error": false}
This module knows the section's shape; it measures nothing and reads no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.diagnoses.pricing.model import StepCosts, summary
from diag.diagnoses.typed import COUNT, POSITIVE, TREE, from_json, internal, meta
from diag.errors import DiagError

NON_NEGATIVE = {"minimum": 0}


D_KEYS = {"minProperties": 1, "propertyNames": {"pattern": "^[1-9][0-9]*$"}}    # num_draft_tokens as a string


@dataclass(frozen=True)
class Costs:
    """StepCosts.to_dict(): seconds; t_verify keyed by num_draft_tokens as a string, e.g. {"4": 0.013}."""
    t_decode: float = meta(schema=POSITIVE)
    t_draft: float = meta(schema=NON_NEGATIVE)
    t_verify: dict[str, float] = meta(schema={**D_KEYS, "additionalProperties": {"type": "number",
                                                                                 "exclusiveMinimum": 0}})
    t_draft_extend: float = meta(schema=NON_NEGATIVE)


@dataclass(frozen=True)
class Spread:
    """The timed calls of one cost, seconds: {"min": 0.00294, "median": 0.00339, "max": 0.00731}."""
    min: float = meta(schema=POSITIVE)
    median: float = meta(schema=POSITIVE)
    max: float = meta(schema=POSITIVE)


@dataclass(frozen=True)
class CostSpread:
    """costs.MeasuredCosts.spread, each cost's calls (t_verify keyed like Costs.t_verify)."""
    t_decode: Spread
    t_draft: Spread
    t_verify: dict[str, Spread] = meta(schema=D_KEYS)
    t_draft_extend: Spread = meta()


@dataclass(frozen=True)
class Row:
    """One evaluation priced (model.summary), keyed and labelled like the evaluation."""
    shape: str = meta(schema=TREE)
    round_cost_s: float = meta(schema=POSITIVE)
    t_verify_s: float = meta(schema=POSITIVE)
    t_verify_measured: bool = meta()
    break_even_accept_length: float = meta(schema=POSITIVE)
    break_even_reachable: bool = meta()
    max_speedup: float = meta(schema=POSITIVE)
    plain_tokens_per_second: float = meta(schema=POSITIVE)
    accept_length: float = meta(schema={"minimum": 1})
    speedup: float = meta(schema=NON_NEGATIVE)
    tokens_per_second: float = meta(schema=NON_NEGATIVE)
    key: str = meta()
    layout: str = meta()
    mode: str = meta(schema={"enum": ["eagle3", "eagle"]})
    tree: str = meta(schema=TREE)
    regime: str = meta()
    tokens_regime: str = meta()
    rendering: str = meta()
    decoding: str = meta()
    num_steps: int = meta(schema={"minimum": 1})
    topk: int = meta(schema={"minimum": 1})
    num_draft_tokens: int = meta(schema={"minimum": 2})
    measurement_error: bool = meta()


@dataclass(frozen=True)
class SpeedupSection:
    source: str = meta(schema={"minLength": 1})
    basis: str = meta(schema={"enum": ["measured", "user"]})
    costs: Costs = meta()
    spread: CostSpread | None = meta()     # measured costs only
    repeats: int | None = meta(schema=COUNT)
    rows: tuple[Row, ...] = meta()
    # for the verdicts (not in report.json): the run's trained layout at its reference axes
    # (pipeline.RunResult.best_layout) and the keys of its evaluations on every tree, in order
    trained_layout: str | None = internal(None)
    trained_keys: tuple[str, ...] = internal(())

    def trained_rows(self) -> list[Row]:
        """The rows of the trained layout, in its order."""
        by_key = {r.key: r for r in self.rows}
        return [by_key[k] for k in self.trained_keys if k in by_key]


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


def speedup_section(evaluations, costs: StepCosts, source: str, *, basis: str, spread: dict | None = None,
                    repeats: int | None = None, trained_layout: str | None = None,
                    trained_keys: tuple[str, ...] = ()) -> SpeedupSection:
    """One row per evaluation with verify rounds, keyed and labelled like the evaluation; a
    sampled variant is priced at its exact expected accept length."""
    rows = []
    for e in evaluations:
        if e.judged_accept_length is None:
            continue
        s = summary(e.judged_accept_length, e.shape, costs)
        rows.append(Row(**s, key=e.key, **e.axes.as_dict(), num_steps=e.shape.num_steps, topk=e.shape.topk,
                        num_draft_tokens=e.shape.num_draft_tokens,
                        measurement_error=s["break_even_accept_length"] < 1.0))
    c = costs.to_dict()
    return SpeedupSection(source, basis, Costs(**c), None if spread is None else from_json(CostSpread, spread), repeats, tuple(rows), trained_layout,
                          tuple(trained_keys))
