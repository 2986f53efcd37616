"""The long-context verdict: where acceptance falls below half of its short-context value.

A warning at the first rung of the ladder (long_context.py) whose mean accepted drafts are
below half of the shortest rung's; info with the curve otherwise. Reads the long_context
section; no models, no files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt


def long_context_verdicts(run) -> list[Verdict]:
    sec = run.long_context
    if not sec or not sec["rungs"]:
        return []
    short = sec["short_context"]
    curve = ", ".join(f"{r['position']}: {fmt(r['accept_length'])}" for r in sec["rungs"])
    head = (f"on {sec['layout']}, {sec['tree']}, prompts up to {sec['length']} tokens cut from "
            f"{sec['source']} (accept length by prompt length: {curve})")
    at = sec["falls_below_half_at"]
    if at is None:
        return [Verdict("long-context", "info", f"Acceptance holds up to {sec['length']} tokens {head}.", sec)]
    row = next(r for r in sec["rungs"] if r["position"] == at)
    return [Verdict("long-context", "warning",
                    f"LONG CONTEXT: from position {at} the drafter accepts {fmt(row['accepted_drafts'])} drafts per "
                    f"round, below half of its short-context {fmt(short['accepted_drafts'])} (accept length "
                    f"{fmt(row['accept_length'])} vs {fmt(short['accept_length'])}) {head}. Check the drafter's "
                    f"RoPE settings against its training length (diag lint), or train it on longer sequences.",
                    sec)]
