"""Verdicts: sentences a ticket can quote, each with its evidence and interval, one module
per subject (layout, serving_error, eagle, regime, speedup, server), the record in record.py.

`verdicts(run)` gathers them, most severe first. The producers read the run's typed
Evaluation records through `select` at the run's reference axes; they know nothing about
models or files.
"""

from __future__ import annotations

from diag.run.verdicts.eagle import eagle_verdicts
from diag.run.verdicts.layout import layout_verdicts
from diag.run.verdicts.record import SEVERITIES, Verdict
from diag.run.verdicts.regime import regime_verdicts
from diag.run.verdicts.server import server_verdicts
from diag.run.verdicts.serving_error import serving_error_verdicts
from diag.run.verdicts.speedup import speedup_verdicts

__all__ = ["Verdict", "verdicts"]


def verdicts(run, target_config: dict) -> list[Verdict]:
    """All verdicts, most severe first (stable within a severity)."""
    layout = layout_verdicts(run)
    found = (serving_error_verdicts(run, layout, target_config) + layout + eagle_verdicts(run)
             + regime_verdicts(run) + server_verdicts(run) + speedup_verdicts(run))
    return sorted(found, key=lambda v: SEVERITIES.index(v.severity))
