"""Tree pricing: will speculation pay? Every evaluated tree shape priced with step costs, the
verdict on the trained layout, the Markdown table and the break-even plot (report key `speedup`).

    model.py       the per-round cost model: StepCosts, round cost, speedup, break-even
    costs.py       the step costs measured on the loaded models (batch 1, with their spread)
    cost_cache.py  those costs remembered per checkpoints and machine, for runs that load no target
    section.py     the typed section (report.json's `speedup`) and the user's [speedup] costs
    verdicts.py    the verdicts: only the user's costs decide (a server-calibrated speedup, offered
                   by another section as `calibrated_speedup`, silences them)
    markdown.py    "Will speculation pay?" and speedup.png

The costs: the user's ([speedup] t_*_ms) when given; else measured while the reference regime's
target is loaded (with_model), remembered beside the passes; when every pass came from the cache
(no target loaded) an earlier run's on this machine for the same checkpoints, else no section and
a note. Worked example: t_decode 11.1 ms, t_verify(4) 13 ms, t_draft 3 ms, chain-3 -> a round
costs 22 ms, break-even accept length 1.98; at 2.0 the predicted speedup is 1.01x.
"""

from __future__ import annotations

import time
from pathlib import Path

from diag.diagnoses.pricing.cost_cache import CostKey, load_costs, save_costs
from diag.diagnoses.pricing.costs import measure_costs
from diag.diagnoses.pricing.markdown import markdown, plot
from diag.diagnoses.pricing.section import SpeedupSection, speedup_section, user_costs
from diag.diagnoses.pricing.verdicts import speedup_verdicts
from diag.diagnoses.protocol import SERVING, Context, Diagnosis, Loaded

NOT_MEASURED = ("step costs not measured: every target pass came from the cache, so no target was loaded; "
                "give your server's costs in [speedup] or run with --no-cache")


class Measurement:
    """The step costs measured on the reference regime's model while the pass has it loaded
    (remembered for the runs whose passes all come from the cache), or an earlier run's."""

    def __init__(self, case):
        self.costs, self.cached_at = None, None
        self.use_cache = True                # a run that loads no target read its passes from the cache
        self.wanted = user_costs(case.speedup) is None and case.speedup.measure

    @staticmethod
    def key(inp) -> CostKey:
        """The cache key of the run's final inputs (a tree the live server added is measured too)."""
        case = inp.case
        return CostKey.make(inp.target_path, inp.drafter_path, inp.regimes[0],
                            f"{case.target.dtype},{case.drafter.dtype}",
                            f"gpus={case.placement.gpus}" if case.placement.gpus else "cpu",
                            case.speedup.context, [s.num_draft_tokens for s in inp.shapes])

    def measure(self, regime: str, model, loaded: Loaded) -> None:
        inp = loaded.inp
        self.use_cache = loaded.use_cache
        if not (self.wanted and regime == inp.regimes[0] and self.costs is None):
            return
        self.remembered(inp, loaded.use_cache)   # measured before for the same checkpoints, machine
        if self.costs is not None:               # and shapes: not needed again
            return
        t0 = time.perf_counter()
        self.costs = measure_costs(model, loaded.drafter, model.get_input_embeddings(),
                                   [s.num_draft_tokens for s in inp.shapes], context=inp.case.speedup.context)
        loaded.timings["target_costs_s"] = round(time.perf_counter() - t0, 3)   # inside target_s
        if loaded.use_cache:
            save_costs(self.key(inp), self.costs)

    def remembered(self, inp, use_cache: bool) -> None:
        """An earlier run's costs when none were measured now."""
        if self.wanted and self.costs is None and use_cache:
            hit = load_costs(self.key(inp))
            if hit is not None:
                self.costs, self.cached_at = hit


class Pricing(Diagnosis):
    name = "pricing"
    key = "speedup"
    Section = SpeedupSection
    place = SERVING
    plot_reads = ("evaluations", "reference")     # the plot marks the reference's variants

    def prepare(self, inp):
        return inp, Measurement(inp.case)

    def with_model(self, state: Measurement, regime: str, model, loaded: Loaded) -> None:
        state.measure(regime, model, loaded)

    def compute(self, ctx: Context) -> SpeedupSection | None:
        """The user's costs when given, else those measured here (now, or by an earlier run on this
        machine with the same checkpoints), else nothing and a note."""
        sp, evals = ctx.inp.case.speedup, ctx.evaluations
        layout, evals_of_it = ctx.trained()
        trained = {"trained_layout": layout, "trained_keys": tuple(e.key for e in evals_of_it)}
        costs = user_costs(sp)
        if costs is not None:
            return speedup_section(evals, costs, "user (case [speedup])", basis="user", **trained)
        measured: Measurement = ctx.prepared.get(self.name) or Measurement(ctx.inp.case)
        measured.remembered(ctx.inp, measured.use_cache)
        if measured.costs is None:
            if measured.wanted:
                ctx.notes.append(NOT_MEASURED)
            return None
        m = measured.costs
        when = f"; measured at {measured.cached_at} by an earlier run" if measured.cached_at else ""
        return speedup_section(evals, m.costs,
                               f"measured by diag on the loaded models (batch 1, context {sp.context}{when})",
                               basis="measured", spread=m.spread, repeats=m.repeats, **trained)

    def verdicts(self, sec: SpeedupSection, others=None) -> list:
        return speedup_verdicts(sec, others)

    def markdown(self, sec: SpeedupSection, rep: dict) -> list[str]:
        return markdown(sec, rep)

    def plots(self, sec: SpeedupSection, rep: dict, folder: Path) -> list[dict]:
        return plot(sec, rep, folder)
