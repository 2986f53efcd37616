"""The engines verdict of a run that compares engines (run/engines_section.py): which engine runs
the drafter as it was trained, and what each other one costs against it. Example:
"vLLM 0.32.0 runs the drafter as it was trained (`embed+L2+L4`, accept length 2.76 on chain-3);
SGLang 0.5.23 feeds `L1+L3+L5`: 1.85 (-0.91)."
Reads the typed EnginesSection; knows no engine by name.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt


def _other(r) -> str:
    if r.served is None or r.accept_length is None:
        return f"{r.label} {r.rule}" if r.served is None else f"{r.label} feeds `{r.served}` ({r.rule})"
    diff = "" if r.difference is None else f" ({r.difference:+.2f})"
    return f"{r.label} feeds `{r.served}` ({r.mode}): {fmt(r.accept_length)}{diff}"


def engines_verdicts(run) -> list[Verdict]:
    sec = getattr(run, "engines", None)
    if sec is None:
        return []
    good = [r for r in sec.rows if r.as_trained]
    others = [r for r in sec.rows if not r.as_trained]
    tail = "; ".join(_other(r) for r in others)
    evidence = sec.to_json()
    if good:
        names = " and ".join(r.label for r in good)
        text = (f"{names} run{'s' if len(good) == 1 else ''} the drafter as it was trained (`{sec.trained}`, accept "
                f"length {fmt(sec.trained_accept_length)} on {sec.tree})" + (f"; {tail}." if tail else "."))
        return [Verdict("engines", "ok" if not others else "warning", text, evidence)]
    text = (f"No engine compared runs the drafter as it was trained (`{sec.trained}`, accept length "
            f"{fmt(sec.trained_accept_length)} on {sec.tree}): {tail}.")
    return [Verdict("engines", "warning", text, evidence)]
