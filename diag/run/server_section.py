"""The report's `server` section: what the server reported, which candidate explains it, the
speedup calibrated from its rates, what its max_running_requests cap costs, and the settings
that make a server benchmark run at diag's predicted acceptance.

Pure: a ServerObservation and the run's Evaluation records in, a JSON-ready dict out. The
trained layout's rows (what the fix would give) are looked up with `select` at the run's
reference axes, the tree left free; every candidate is taken at the reference (served) decoding.
"""

from __future__ import annotations

from diag.engines import DEFAULT_FAMILY, engine
from diag.engines.sglang.server_releases import server_release
from diag.engines.sglang.simulate import simulated_acceptance
from diag.metrics import summary
from diag.replay.evaluation import ANY, Axes, select
from diag.run.calibrate import calibration, concurrency
from diag.run.reconcile import reconcile
from diag.run.server_observation import ServerObservation
from diag.run.server_sampled import sanity


def _trained(evaluations, reference: Axes, layout: str | None) -> list[dict]:
    if layout is None:
        return []
    return [{"key": e.key, "tree": e.tree, "accept_length": e.accept_length,
             "accept_length_ci95": list(e.accept_length_ci95)}
            for e in select(evaluations, reference, layout=layout, tree=ANY) if e.accept_length is not None]


def _exports(evaluations, reference: Axes, layout: str | None, obs: ServerObservation) -> list[dict]:
    """SGLang / vLLM simulated-acceptance settings for the trained layout on every evaluated tree
    (written for the default family's releases: none for another family's server)."""
    if layout is None or engine(obs.engine).family != DEFAULT_FAMILY:
        return []
    rel = server_release(obs.release)
    out = []
    for e in select(evaluations, reference, layout=layout, tree=ANY):
        if e.accept_length is None:
            continue
        depth = tuple(summary(e.trajectory)["acceptance_at_depth"])
        out.append({"key": e.key, "tree": e.tree,
                    **simulated_acceptance(e.accept_length, depth, e.shape, rel).to_json()})
    return out


def server_section(obs: ServerObservation, evaluations, reference: Axes, trained_layout: str | None, *,
                   seed: int, n_boot: int, served_layout: str | None = None) -> dict:
    check = sanity(obs, evaluations, reference, served_layout)
    # the server decodes with the served decoding: only candidates evaluated under it can explain it
    evaluations = [e for e in evaluations if e.axes.decoding == reference.decoding]
    rec = reconcile(evaluations, obs, seed=seed, n_boot=n_boot)
    return {"observed": obs.to_json(),
            "reconciliation": None if rec is None else rec.to_json(),
            "trained_layout": trained_layout,
            "trained": _trained(evaluations, reference, trained_layout),
            "speedup": calibration(obs, evaluations),
            "concurrency": concurrency(obs.concurrency, obs.max_running_requests, obs.max_running_requests_source,
                                       obs.load),
            "simulate": _exports(evaluations, reference, trained_layout, obs),
            "sanity": None if check is None else check.to_json()}
