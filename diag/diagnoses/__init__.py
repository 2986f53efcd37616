"""The diagnoses: one module each, behind one small interface (protocol.py), listed here in
the order the pipeline runs them, report.json writes their sections, the verdicts list their
findings (within a severity) and report.md shows them.

    pricing        will speculation pay: every tree priced (report key `speedup`)    pricing/
    quantization_regimes  drift, agreement and acceptance per regime (key `regimes`) quantization_regimes.py
    live_serving   the live server reconciled with the candidates (report key `server`) live_serving/
    prompt_renderings  acceptance per prompt rendering (key `renderings`)       prompt_renderings.py
    coverage       continuation tokens outside the drafter's hot vocabulary         coverage.py
    loops          accept length with and without the rounds inside repeated cycles  loops.py
    long_context   acceptance against position, up to the case's length            long_context.py
    near_ties      the target's decisions whose top two tokens are within 0.05       near_ties.py

A new diagnosis is one module beside these (a Diagnosis subclass with its frozen Section) and
one line here; hooks.py runs them, serialises their sections from their types, generates
their JSON Schema, gathers their verdicts, Markdown and plots, each at the diagnosis's place
(protocol.PLACES). ORDER: an output that shows the diagnoses of one place in another order
than the registry's (hooks._at); a new diagnosis need not appear in it.
This module is the list only.
"""

from __future__ import annotations

from diag.diagnoses.coverage import Coverage
from diag.diagnoses.live_serving import LiveServing
from diag.diagnoses.long_context import LongContext
from diag.diagnoses.loops import Loops
from diag.diagnoses.near_ties import NearTies
from diag.diagnoses.pricing import Pricing
from diag.diagnoses.prompt_renderings import PromptRenderings
from diag.diagnoses.protocol import Diagnosis
from diag.diagnoses.quantization_regimes import QuantizationRegimes

ORDER: dict[str, tuple[str, ...]] = {          # the serving side's order before it moved here
    "markdown": ("pricing", "live_serving", "quantization_regimes"),
    "verdicts": ("quantization_regimes", "live_serving", "pricing"),
}

DIAGNOSES: tuple[Diagnosis, ...] = (
    Pricing(),
    QuantizationRegimes(),
    LiveServing(),
    PromptRenderings(),
    Coverage(),
    Loops(),
    LongContext(),
    NearTies(),
)
