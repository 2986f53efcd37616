"""Verdicts on the prompt side of a run: rendering, then the registered diagnoses'
(diag/diagnoses/). Gathered here so the verdict list reads them as one group."""

from __future__ import annotations

from diag.run.verdicts.rendering import rendering_verdicts


def prompt_side_verdicts(run) -> list:
    from diag.diagnoses.hooks import verdicts_all      # the registered diagnoses import this package's record
    return rendering_verdicts(run) + verdicts_all(getattr(run, "diagnoses", {}))
