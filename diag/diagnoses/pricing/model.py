"""Will speculation pay? The per-round cost model (DESIGN.md §1.6, §6).

Per verify round the server pays one target forward over D tokens (verify) plus
S drafter forwards (plus, optionally, one drafter "extend" pass over the accepted
tokens), and emits accept_length tokens:
    tokens/s (spec)   = accept_length / (t_verify(D) + S·t_draft + t_draft_extend)
    tokens/s (plain)  = 1 / t_decode
    speedup           = accept_length · t_decode / round_cost
    break-even        = round_cost / t_decode        (accept length where speedup = 1)
Example: t_decode 11.1 ms, t_verify(4) 13 ms, t_draft 3 ms, S = 3 -> round 22 ms,
break-even accept length 22 / 11.1 = 1.98; at accept length 2.0 the speedup is
1.01, at 1.8 it is 0.91 (speculation loses).

This module takes measured seconds as numbers; measuring them is someone else's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diag.errors import DiagError
from diag.trees import TreeShape


@dataclass(frozen=True)
class StepCosts:
    """Seconds per forward, for one sequence at the batch size of interest.

    t_decode        one plain decode step of the target (1 token)
    t_draft         one drafter forward (one depth step over K rows)
    t_verify        {D: seconds} target forward over D tokens, as measured
    t_draft_extend  drafter pass over the accepted tokens after verify (0 if
                    folded into t_draft or not measured)
    """

    t_decode: float
    t_draft: float
    t_verify: dict[int, float] = field(default_factory=dict)
    t_draft_extend: float = 0.0

    def __post_init__(self):
        if not self.t_verify:
            raise DiagError("verify cost needs at least one measured num_draft_tokens",
                            field="t_verify", expected="{D: seconds}, e.g. {4: 0.013}", found="{}")
        bad = {k: v for k, v in self.t_verify.items() if k < 1 or v <= 0}
        if self.t_decode <= 0 or self.t_draft < 0 or self.t_draft_extend < 0 or bad:
            raise DiagError("step costs must be positive seconds", field="costs",
                            expected="t_decode > 0, t_draft >= 0, t_verify {D >= 1: > 0}",
                            found=(self.t_decode, self.t_draft, bad or self.t_verify))

    def to_dict(self) -> dict:
        return {"t_decode": self.t_decode, "t_draft": self.t_draft,
                "t_verify": {str(k): v for k, v in sorted(self.t_verify.items())},
                "t_draft_extend": self.t_draft_extend}

    @classmethod
    def from_dict(cls, d: dict) -> "StepCosts":
        try:
            verify = {int(k): float(v) for k, v in d["t_verify"].items()}
            return cls(float(d["t_decode"]), float(d["t_draft"]), verify,
                       float(d.get("t_draft_extend", 0.0)))
        except (KeyError, ValueError, AttributeError) as e:
            raise DiagError("step costs are malformed", field="costs",
                            expected="t_decode, t_draft, t_verify {D: seconds}",
                            found=repr(e)) from None


def verify_cost(costs: StepCosts, num_draft_tokens: int) -> float:
    """t_verify(D): the measured value if D was measured, else piecewise linear in D.

    Between two measured points: linear interpolation.
    Above the largest: linear extrapolation through the two largest points,
    never below the largest D's cost (flat if only one point was measured).
    Below the smallest: the smallest D's cost (verify of few tokens is
    memory-bound; its cost hardly falls with fewer tokens).
    Example: {2: 10 ms, 8: 16 ms} -> D=4: 12 ms; D=10: 18 ms; D=1: 10 ms.
    """
    pts = sorted(costs.t_verify.items())
    d = num_draft_tokens
    if d in costs.t_verify:
        return costs.t_verify[d]
    if d < pts[0][0] or len(pts) == 1:
        return pts[0][1]
    (d0, t0), (d1, t1) = _bracket(pts, d)
    line = t0 + (t1 - t0) * (d - d0) / (d1 - d0)
    return line if d < pts[-1][0] else max(line, pts[-1][1])


def _bracket(pts: list[tuple[int, float]], d: int):
    """The two measured points that interpolate (or, past the end, extrapolate) d."""
    for a, b in zip(pts, pts[1:]):
        if a[0] < d < b[0]:
            return a, b
    return pts[-2], pts[-1]


def round_cost(shape: TreeShape, costs: StepCosts) -> float:
    """Seconds per verify round: t_verify(D) + S·t_draft + t_draft_extend."""
    return (verify_cost(costs, shape.num_draft_tokens) + shape.num_steps * costs.t_draft
            + costs.t_draft_extend)


def tokens_per_second(accept_length: float, shape: TreeShape, costs: StepCosts) -> float:
    """Speculative decode rate; accept_length includes the bonus token."""
    return accept_length / round_cost(shape, costs)


def speedup(accept_length: float, shape: TreeShape, costs: StepCosts) -> float:
    """Speculative rate over plain decode rate (> 1: speculation pays)."""
    return accept_length * costs.t_decode / round_cost(shape, costs)


def break_even_accept_length(shape: TreeShape, costs: StepCosts) -> float:
    """The accept length (bonus included) at which speculation merely ties plain
    decoding. Above S+1 it is unreachable: this shape can never pay."""
    return round_cost(shape, costs) / costs.t_decode


def summary(accept_length: float | None, shape: TreeShape, costs: StepCosts) -> dict:
    """Every number of the model, for the report."""
    be = break_even_accept_length(shape, costs)
    out = {"shape": shape.name, "round_cost_s": round_cost(shape, costs),
           "t_verify_s": verify_cost(costs, shape.num_draft_tokens),
           "t_verify_measured": shape.num_draft_tokens in costs.t_verify,
           "break_even_accept_length": be, "break_even_reachable": be <= shape.num_steps + 1,
           "max_speedup": speedup(shape.num_steps + 1.0, shape, costs),
           "plain_tokens_per_second": 1.0 / costs.t_decode}
    if accept_length is not None:
        out["accept_length"] = accept_length
        out["speedup"] = speedup(accept_length, shape, costs)
        out["tokens_per_second"] = tokens_per_second(accept_length, shape, costs)
    return out
