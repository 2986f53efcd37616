"""The serving-error verdict: the engine cannot serve the drafter as configured (layer ids it
cannot capture, a shape that crashes the first draft forward), and the ids that would serve
the layout the drafter was trained on, from the engine's own rules (diag.engine.serving).

Reads the run's typed ServingError and Evaluation records; knows nothing about models.
"""

from __future__ import annotations

from diag.engine.serving import IDS_FIELD, capture_convention, serving_ids
from diag.layouts import layout
from diag.run.verdicts.layout import likely_trained
from diag.run.verdicts.record import Verdict


def serving_error_verdicts(run, found: list[Verdict], target_config: dict) -> list[Verdict]:
    err = run.serving_error
    if err is None:
        return []
    trained = likely_trained(run, found)
    engine = run.case.serving.engine
    fix, ids = "", None
    if trained is not None and trained != "final (EAGLE)":
        ids = serving_ids(layout(trained), target_config, engine_name=engine)
        rule = capture_convention(target_config, engine_name=engine)
        fix = (f" The drafter was trained on {trained}; write {IDS_FIELD} = {ids} ({engine}, {rule})."
               if ids is not None else
               f" The drafter was trained on {trained}, which {engine} ({rule}) cannot capture with any "
               "ids: retrain on a layout it can serve.")
    text = f"SERVING ERROR: {engine} cannot serve this drafter as configured: {err}.{fix}"
    return [Verdict("serving-error", "error", text,
                    {"errors": [str(err)], "trained": trained, "fix_ids": ids, "engine": engine})]
