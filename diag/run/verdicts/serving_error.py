"""The serving-error verdict: the engine cannot serve the drafter as configured (layer ids it
cannot capture, a shape that crashes the first draft forward), and the ids that would serve
the layout the drafter was trained on, from the engine's own rules (EngineRules.fix_for).

Reads the run's typed ServingError and Evaluation records; knows nothing about models.
"""

from __future__ import annotations

from diag.engines import engine as engine_of, rules
from diag.layouts import layout
from diag.run.verdicts.layout import likely_trained
from diag.run.verdicts.record import Verdict


# Serving errors on a key that has nothing to do with the layer ids: the verdict proposes the
# key, not ids (drafter_keys.draft_vocab_crash: the Llama EAGLE-3 class cannot be built).
KEY_FIXES = frozenset({"draft_vocab_size"})


def serving_error_verdicts(run, found: list[Verdict], target_config: dict) -> list[Verdict]:
    """Example (Kimi-K2.5 on 0.5.13, drafter trained on embed+L3+L31, ids [0, 3, 31]):
    "SERVING ERROR: sglang-0.5.13 cannot serve this drafter as configured: ... The drafter
    was trained on embed+L3+L31; SGLang 0.5.13 (sglang-deepseek-0.5.13) cannot capture
    embed+L3+L31 with any ids: upgrade to SGLang 0.5.14 or newer, where ... = [0, 3, 31]
    serves it, or retrain ..." (on 0.5.23 the same config serves embed+L3+L31: no error)."""
    err = run.serving_error
    if err is None:
        return []
    trained = likely_trained(run, found)
    engine = run.case.serving.engine
    fix, ids, upgrade = "", None, None
    if err.field in KEY_FIXES:            # the key itself is the fix, whatever the layout
        fix = f" Fix: set {err.field} in the drafter's config.json to {err.expected}."
    elif trained is not None and trained != "final (EAGLE)":
        f = rules(engine).fix_for(layout(trained), target_config, release=engine_of(engine))
        ids, upgrade = f.ids, f.upgrade
        fix = f" The drafter was trained on {trained}; {f.text}."
    text = f"SERVING ERROR: {engine} cannot serve this drafter as configured: {err}.{fix}"
    return [Verdict("serving-error", "error", text,
                    {"errors": [str(err)], "trained": trained, "fix_ids": ids, "engine": engine,
                     "upgrade": None if upgrade is None else {"version": upgrade[0], "ids": upgrade[1]}})]
