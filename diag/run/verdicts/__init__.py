"""Verdicts: sentences a ticket can quote, each with its evidence and interval, one module
per subject (target_output, floor, layout, serving_error, eagle, engines, decoding) and the registered diagnoses' own (diag/diagnoses/), the
record in record.py.
When the drafter predicts nothing on any layout (floor.py), that verdict replaces the layout
and EAGLE verdicts: a tie of zeros says nothing about which layout the server should feed.
When the target's continuations are garbage (target_output.py), its error replaces the floor
verdict too: the fault is the target's.

`verdicts(run)` gathers them, most severe first. The producers read the run's typed
Evaluation records through `select` at the run's reference axes; they know nothing about
models or files.
"""

from __future__ import annotations

from diag.run.verdicts.decoding import decoding_verdicts
from diag.run.verdicts.eagle import eagle_verdicts
from diag.run.verdicts.engines import engines_verdicts
from diag.run.verdicts.floor import floor_verdicts
from diag.run.verdicts.layout import layout_verdicts
from diag.run.verdicts.record import SEVERITIES, Verdict
from diag.run.verdicts.serving_error import serving_error_verdicts
from diag.run.verdicts.target_output import target_output_verdicts

__all__ = ["Verdict", "verdicts"]


def verdicts(run, target_config: dict) -> list[Verdict]:
    """All verdicts, most severe first (stable within a severity; an engine defect leads its severity).
    The registered diagnoses' (diag/diagnoses/) come at their places: those that lead first, the
    serving side's after the engines', the prompt side's last."""
    from diag.diagnoses.hooks import leading_all, verdicts_all   # the diagnoses import this package's record
    from diag.diagnoses.protocol import SERVING
    sections = getattr(run, "diagnoses", {})
    floor = floor_verdicts(run)
    target = target_output_verdicts(run, bool(floor))
    if any(v.severity == "error" for v in target):
        floor = []                       # garbage continuations: the target's fault, not the drafter's
    silent = bool(floor) or any(v.severity == "error" for v in target)
    layout = [] if silent else layout_verdicts(run, target_config)
    found = (leading_all(sections) + target + floor + serving_error_verdicts(run, floor + layout, target_config)
             + layout + ([] if silent else eagle_verdicts(run)) + engines_verdicts(run)
             + verdicts_all(sections, SERVING) + decoding_verdicts(run) + verdicts_all(sections))
    return sorted(found, key=lambda v: SEVERITIES.index(v.severity))
