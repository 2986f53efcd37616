"""The rendering verdict: does the way the server renders prompts cost acceptance relative
to the rendering the drafter was trained with?

With a trained rendering named in the case and different from the serving one: a warning when
the paired 95% interval of (serving - trained) lies below zero, ok when it reaches zero; ok when
the two are the same rendering. Without one, an info line per rendering evaluated. Reads the renderings section
(rendering_section.py); knows nothing about models or files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt


def _where(row: dict) -> str:
    d = row["differs_from_serving"]
    if not d or not d["examples"]:
        return "the two render every prompt to the same tokens"
    ex = d["examples"][0]
    side = lambda text: repr(text) if text else "nothing more"
    return (f"the renders first differ at token {ex['index']} of prompt {ex['prompt']}: after "
            f"{ex['context']!r} the server has {side(ex['serving'])}, the training render {side(ex['other'])} "
            f"({d['prompts'] - d['identical']} of {d['prompts']} prompts differ)")


def rendering_verdicts(run) -> list[Verdict]:
    sec = run.renderings
    if not sec:
        return []
    rows = {r["rendering"]: r for r in sec["rows"]}
    serving, trained = rows[sec["serving"]], rows.get(sec["trained"]) if sec["trained"] else None
    if trained is serving:
        return [Verdict("rendering-match", "ok", f"The server renders prompts as the drafter was trained "
                        f"({sec['serving']}): accept length {fmt(serving['accept_length'])} on {sec['layout']}, "
                        f"{sec['tree']}.", {"rows": sec["rows"]})]
    if trained is None or trained["vs_serving"] is None:
        listing = ", ".join(f"{r['rendering']} {fmt(r['accept_length'])}" for r in sec["rows"])
        return [Verdict("renderings", "info", f"Accept length by prompt rendering on {sec['layout']}, "
                        f"{sec['tree']} (serving: {sec['serving']}): {listing}.", {"rows": sec["rows"]})]
    d, (lo, hi) = -trained["vs_serving"]["difference"], trained["vs_serving"]["ci95"]
    lo, hi = -hi, -lo                                   # serving - trained
    evidence = {"serving": sec["serving"], "trained": sec["trained"], "serving_accept_length":
                serving["accept_length"], "trained_accept_length": trained["accept_length"],
                "difference": d, "ci95": [lo, hi], "differs": trained["differs_from_serving"]}
    numbers = (f"accept length {fmt(serving['accept_length'])} served vs {fmt(trained['accept_length'])} "
               f"with the training rendering on {sec['layout']}, {sec['tree']} (difference {d:+.2f}, "
               f"95% CI [{lo:+.2f}, {hi:+.2f}], paired over {run.prompts['count']} prompts)")
    if hi < 0:
        text = (f"RENDERING MISMATCH: the server renders prompts as {sec['serving']}, the drafter was trained "
                f"on {sec['trained']}: {numbers}; {_where(trained)}.")
        return [Verdict("rendering-mismatch", "warning", text, evidence)]
    text = (f"The serving rendering {sec['serving']} costs no measurable acceptance against the training "
            f"rendering {sec['trained']}: {numbers}.")
    return [Verdict("rendering-match", "ok", text, evidence)]
