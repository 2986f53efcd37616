"""The floor verdict: the drafter predicts nothing on any candidate layout.

Accept length counts the bonus token, so 1.00 means no draft token is ever accepted. When
every candidate at the run's reference axes (every eagle3 layout and the EAGLE mode) has a
95% interval whose top is at most FLOOR_TOP, the layouts cannot be told apart: the serving
layout "matching" the best would only be a tie of zeros. This verdict then replaces the
layout and EAGLE verdicts, and lists the drafter checks that point at why (diag.drafter.health).
Worked example: seven layouts all at 1.00 (CI 1.00-1.00), d2t with 1023 descents ->
"DRAFTER PREDICTS NOTHING ... [FAIL] d2t order: d2t is not ascending ...".

Reads Evaluation records and the run's health checks; knows nothing about models or files.
"""

from __future__ import annotations

from diag.replay.evaluation import ANY, select
from diag.run.verdicts.record import Verdict, fmt

FLOOR_TOP = 1.10     # under one accepted draft token per ten rounds, even at the interval's top


def _pool(run) -> list:
    """Every candidate with verify rounds at the reference axes, any mode, best first."""
    return sorted((e for e in select(run.evaluations, run.reference.but(mode=ANY)) if e.accept_length),
                  key=lambda e: -e.accept_length)


def at_floor(run) -> bool:
    pool = _pool(run)
    return bool(pool) and all(e.accept_length_ci95[1] <= FLOOR_TOP for e in pool)


def floor_verdicts(run) -> list[Verdict]:
    if not at_floor(run):
        return []
    pool = _pool(run)
    top = pool[0]
    checks = list(getattr(run, "drafter_health", ()) or ())
    failed = [c for c in checks if not c.ok]
    listed = "; ".join(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in failed + [
        c for c in checks if c.ok])
    why = (f" Checks: {listed}." if checks else "")
    hint = ("" if failed else " None of the checks fails: look at how the drafter was exported "
            "(weights of another run, a head trained for another tokenizer).")
    text = (f"DRAFTER PREDICTS NOTHING: accept length is at the floor on every one of the {len(pool)} "
            f"candidate(s) (best {top.layout} "
            f"{fmt(top.accept_length)}, 95% CI {fmt(top.accept_length_ci95[0])}-"
            f"{fmt(top.accept_length_ci95[1])} on {top.tree} over {run.prompts['count']} prompts; 1.00 "
            f"means no draft token is ever accepted), so no layout can be told from another and the "
            f"serving layout is not checked.{why}{hint}")
    return [Verdict("drafter-predicts-nothing", "error", text,
                    {"floor_top": FLOOR_TOP, "candidates": [(e.layout, e.mode, e.accept_length,
                                                             list(e.accept_length_ci95)) for e in pool],
                     "checks": [c.to_json() for c in checks]})]
