"""The report's `server` section: what the server reported, which candidate explains it, the
speedup calibrated from its rates, what its max_running_requests cap costs, and the settings
that make a server benchmark run at diag's predicted acceptance.

Pure: a ServerObservation and the run's Evaluation records in, a ServerSection out. The
trained layout's rows (what the fix would give) are looked up with `select` at the run's
reference axes, the tree left free; every candidate is taken at the reference (served) decoding.
Every part is a frozen dataclass (parts.py: what observation.py, reconcile.py, calibrate.py and
the engines' sanity and simulation records report), so report.json, its reading back and its
JSON Schema all come from the types (diag/diagnoses/typed.py). Worked example of a `trained`
row (the seed run):
    {"key": "embed+L2+L4|eagle3|chain-3|as-loaded", "tree": "chain-3", "accept_length": 3.09,
     "accept_length_ci95": [2.99, 3.21]}
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.diagnoses.live_serving import parts
from diag.diagnoses.live_serving.calibrate import calibration, concurrency
from diag.diagnoses.live_serving.observation import ServerObservation
from diag.diagnoses.live_serving.reconcile import reconcile
from diag.diagnoses.live_serving.sampled import sanity
from diag.diagnoses.typed import TREE, internal, meta
from diag.engines import engine
from diag.engines.simulate import simulated_acceptance
from diag.metrics import summary
from diag.replay.evaluation import ANY, Axes, select


@dataclass(frozen=True)
class Trained:
    key: str
    tree: str = meta(schema=TREE)
    accept_length: float = meta(schema={"minimum": 1})
    accept_length_ci95: tuple[float, float] = meta()


@dataclass(frozen=True)
class ServerSection:
    observed: parts.Observed
    reconciliation: parts.Reconciliation | None
    trained_layout: str | None
    trained: tuple[Trained, ...]
    speedup: parts.Calibration | None
    concurrency: parts.Concurrency | None
    simulate: tuple[parts.SimulateRow, ...]
    sanity: parts.Sanity | None
    # for the verdicts (not in report.json): the run's reference axes, the layouts the case's
    # configuration serves, and the keys of the trained layout's evaluations at the reference
    reference: Axes = internal(Axes())
    served: tuple[str, ...] = internal(())
    trained_keys: tuple[str, ...] = internal(())

    @property
    def calibrated_speedup(self) -> parts.Calibration | None:
        """What this section offers the other diagnoses (protocol.Offered): the speedup calibrated
        from the server's own rates, which decides over any other costs."""
        return self.speedup


def _trained(evaluations, reference: Axes, layout: str | None) -> tuple[Trained, ...]:
    if layout is None:
        return ()
    return tuple(Trained(e.key, e.tree, e.accept_length, tuple(e.accept_length_ci95))
                 for e in select(evaluations, reference, layout=layout, tree=ANY) if e.accept_length is not None)


def _exports(evaluations, reference: Axes, layout: str | None,
             obs: ServerObservation) -> tuple[parts.SimulateRow, ...]:
    """Every engine's settings for a benchmark at the trained layout's predicted acceptance on
    every evaluated tree (diag/engines/simulate.py; notes worded for the observed release)."""
    if layout is None:
        return ()
    served = engine(obs.engine or obs.release)        # a bare release names the default family
    out = []
    for e in select(evaluations, reference, layout=layout, tree=ANY):
        if e.accept_length is None:
            continue
        depth = tuple(summary(e.trajectory)["acceptance_at_depth"])
        sim = simulated_acceptance(e.accept_length, depth, e.shape, served)
        out.append(parts.SimulateRow(e.key, e.tree, sim.accept_length,
                                     {k: v for s in sim.settings for k, v in s.fields.items()}, sim.notes))
    return tuple(out)


def _sanity(check) -> parts.Sanity | None:
    """The engine's T -> 0 check (diag/engines/sanity.EngineSanity) as the section reports it."""
    if check is None:
        return None
    low = check.lowest
    return parts.Sanity(check.verdict, check.engine, check.greedy, check.greedy_source,
                        None if low is None else parts.SampledRun.of(low),
                        check.tolerance, check.message)


def server_section(obs: ServerObservation, evaluations, reference: Axes, trained_layout: str | None, *,
                   seed: int, n_boot: int, served_layout: str | None = None,
                   served: tuple[str, ...] | None = None) -> ServerSection:
    """`served_layout`: the layout the configuration serves (the sanity check's greedy prediction);
    `served`: every candidate with the serving role (default: that one)."""
    check = sanity(obs, evaluations, reference, served_layout)
    keys = () if trained_layout is None else tuple(
        e.key for e in select(evaluations, reference, layout=trained_layout, tree=ANY))
    # the server decodes with the served decoding: only candidates evaluated under it can explain it
    evaluations = [e for e in evaluations if e.axes.decoding == reference.decoding]
    rec = reconcile(evaluations, obs, seed=seed, n_boot=n_boot)
    return ServerSection(
        obs.report(), None if rec is None else rec.report(), trained_layout,
        _trained(evaluations, reference, trained_layout), calibration(obs, evaluations),
        concurrency(obs.concurrency, obs.max_running_requests, obs.max_running_requests_source, obs.load),
        _exports(evaluations, reference, trained_layout, obs), _sanity(check),
        reference, served if served is not None else (() if served_layout is None else (served_layout,)), keys)
