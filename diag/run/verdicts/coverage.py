"""The draft-vocabulary verdict: does the drafter's hot vocabulary limit acceptance?

A warning when the 95% interval of the share of the served drafter's rejections that fall on
a token outside its hot vocabulary (t2d false) lies above LIMITS_AT: at least one rejection in
ten is one no better-trained drafter with this vocabulary could avoid. Otherwise ok. The text
quotes the uncovered share of the continuation, the ceiling it implies and the most frequent
uncovered tokens. Reads the coverage section (coverage.py); no models, no files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt

LIMITS_AT = 0.10


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def coverage_verdicts(run) -> list[Verdict]:
    sec = run.coverage
    if not sec or sec["uncovered"]["share"] is None:
        return []
    u, rej = sec["uncovered"], sec["rejected_at_uncovered"]
    top = ", ".join(f"{t['text']!r} ({t['count']})" for t in sec["top_uncovered"][:5]) or "none"
    worst = max(sec["by_category"], key=lambda c: c["uncovered"]["share"] or 0.0)
    core = (f"{_pct(u['share'])} of the target's continuation tokens (95% CI {_pct(u['ci95'][0])}-"
            f"{_pct(u['ci95'][1])}) are outside the drafter's hot vocabulary of {sec['hot_vocabulary']} "
            f"(t2d false); that caps accept length on {sec['tree']} at {fmt(sec['ceiling_measured'])} for a "
            f"perfect drafter ({fmt(sec['ceiling_formula'])} if they were spread evenly; measured "
            f"{fmt(sec['accept_length'])}). {_pct(rej['share'])} of the drafter's rejections fall on such a "
            f"token (95% CI {_pct(rej['ci95'][0])}-{_pct(rej['ci95'][1])}). Most frequent uncovered: {top}. "
            f"Most uncovered category: {worst['category']} ({_pct(worst['uncovered']['share'])}).")
    if rej["ci95"][0] is not None and rej["ci95"][0] > LIMITS_AT:
        return [Verdict("vocabulary-coverage", "warning", "DRAFT VOCABULARY LIMITS ACCEPTANCE: " + core
                        + " Retrain with a hot vocabulary drawn from the served traffic.", sec)]
    return [Verdict("vocabulary-coverage-ok", "ok", "Draft vocabulary coverage does not limit acceptance: "
                    + core, sec)]
