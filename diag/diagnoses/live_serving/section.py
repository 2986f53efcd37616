"""The report's `server` section: what the server reported, which candidate explains it, the
speedup calibrated from its rates, what its max_running_requests cap costs, and the settings
that make a server benchmark run at diag's predicted acceptance.

Pure: a ServerObservation and the run's Evaluation records in, a ServerSection out. The
trained layout's rows (what the fix would give) are looked up with `select` at the run's
reference axes, the tree left free; every candidate is taken at the reference (served) decoding.
Its parts are typed at the top level: `trained` rows as dataclasses, the others as the JSON
their producers write (observation.py, reconcile.py, calibrate.py, the engine's sanity and
simulation records), each with its JSON Schema from schema.json beside this module. Worked
example of a `trained` row (the seed run):
    {"key": "embed+L2+L4|eagle3|chain-3|as-loaded", "tree": "chain-3", "accept_length": 3.09,
     "accept_length_ci95": [2.99, 3.21]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from diag.diagnoses.live_serving.calibrate import calibration, concurrency
from diag.diagnoses.live_serving.observation import ServerObservation
from diag.diagnoses.live_serving.reconcile import reconcile
from diag.diagnoses.live_serving.sampled import sanity
from diag.diagnoses.typed import internal, meta
from diag.engines import engine
from diag.engines.simulate import simulated_acceptance
from diag.metrics import summary
from diag.replay.evaluation import ANY, Axes, select

PARTS = json.loads((Path(__file__).with_name("schema.json")).read_text())   # each part's JSON Schema


@dataclass(frozen=True)
class Trained:
    key: str
    tree: str = meta(schema=PARTS["trained"]["items"]["properties"]["tree"])
    accept_length: float = meta(schema={"minimum": 1})
    accept_length_ci95: tuple[float, float] = meta()


@dataclass(frozen=True)
class ServerSection:
    observed: dict = meta(schema=PARTS["observed"])
    reconciliation: dict | None = meta(schema=PARTS["reconciliation"])
    trained_layout: str | None = meta()
    trained: tuple[Trained, ...] = meta()
    speedup: dict | None = meta(schema=PARTS["speedup"])
    concurrency: dict | None = meta(schema=PARTS["concurrency"])
    simulate: tuple[dict, ...] = meta(schema=PARTS["simulate"])
    sanity: dict | None = meta(schema=PARTS["sanity"])
    # for the verdicts (not in report.json): the run's reference axes, the layouts the case's
    # configuration serves, and the keys of the trained layout's evaluations at the reference
    reference: Axes = internal(Axes())
    served: tuple[str, ...] = internal(())
    trained_keys: tuple[str, ...] = internal(())

    @property
    def calibrated_speedup(self) -> dict | None:
        """What this section offers the other diagnoses (protocol.Offered): the speedup calibrated
        from the server's own rates, which decides over any other costs."""
        return self.speedup


def _trained(evaluations, reference: Axes, layout: str | None) -> tuple[Trained, ...]:
    if layout is None:
        return ()
    return tuple(Trained(e.key, e.tree, e.accept_length, tuple(e.accept_length_ci95))
                 for e in select(evaluations, reference, layout=layout, tree=ANY) if e.accept_length is not None)


def _exports(evaluations, reference: Axes, layout: str | None, obs: ServerObservation) -> tuple[dict, ...]:
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
        out.append({"key": e.key, "tree": e.tree,
                    **simulated_acceptance(e.accept_length, depth, e.shape, served).to_json()})
    return tuple(out)


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
        obs.to_json(), None if rec is None else rec.to_json(), trained_layout,
        _trained(evaluations, reference, trained_layout), calibration(obs, evaluations),
        concurrency(obs.concurrency, obs.max_running_requests, obs.max_running_requests_source, obs.load),
        _exports(evaluations, reference, trained_layout, obs), None if check is None else check.to_json(),
        reference, served if served is not None else (() if served_layout is None else (served_layout,)), keys)
