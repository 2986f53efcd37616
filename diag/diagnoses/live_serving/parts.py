"""The typed parts of report.json's `server` section: one frozen dataclass per object it holds,
field order = key order, constraints beside the types (diag/diagnoses/typed.py writes the JSON,
reads it back and generates the JSON Schema from these classes).

    observed        Observed: the server's numbers (observation.ServerObservation as reported)
    reconciliation  Reconciliation: the candidates ranked by how well they explain it (reconcile.py)
    speedup         Calibration: the speedup model calibrated from its rates (calibrate.py)
    concurrency     Concurrency: what its running-request cap costs (calibrate.py)
    simulate        SimulateRow: every engine's benchmark settings at a predicted acceptance
    sanity          Sanity: the engine's T -> 0 check of its sampled runs (diag/engines/sanity.py)

Two parts stay maps on purpose:
- a candidate's `axes` ({"layout": ..., "mode": ..., "tree": ...}): whatever axes the run has,
  checked by the report schema's shared `$defs/axes`, never named here;
- a SimulateRow's engine fields: each registered engine writes its own keys into the row
  (BenchmarkSettings.fields, e.g. an environment map and a command prefix); naming them here
  would name an engine outside its package (tests/test_architecture.py), so the row keeps them
  as one spread `dict` in its place: {"key", "tree", "accept_length", <each engine's fields>,
  "notes"}, worded back by each engine (EngineRules.simulation_cell) and checked by each
  engine's schema (EngineRules.simulation_schema, added to the row's by LiveServing.schema).
Worked example of a reported accept length (the seed's log):
    Reported(1.675, (1.66, 1.69), "scheduler log, 2 decode lines")
    -> {"value": 1.675, "ci95": [1.66, 1.69], "source": "scheduler log, 2 decode lines"}
This module knows report shapes only: no arithmetic, no files, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.diagnoses.typed import AT_LEAST_ONE, COUNT, POSITIVE, RATE, TREE, meta, spread

AXES = {"$ref": "#/$defs/axes"}                  # the report schema's shared candidate axes
RELEASE = {"pattern": r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+|\.[0-9]+)?$"}


@dataclass(frozen=True)
class Reported:
    """One accept length the server reported, its 95% interval, and where it came from."""
    value: float = meta(schema=AT_LEAST_ONE)
    ci95: tuple[float, float] = meta()
    source: str = meta()


@dataclass(frozen=True)
class ServerFile:
    kind: str = meta(schema={"minLength": 1})    # "log", "baseline_log", "responses", an engine's reader
    path: str = meta()


@dataclass(frozen=True)
class Request:
    """One request's counts as the engine reported them (responses paired with the prompts)."""
    id: str
    rounds: int = meta(schema=COUNT)
    accepted_sum: int = meta(schema=COUNT)
    completion_tokens: int = meta(schema=COUNT)


@dataclass(frozen=True)
class ServerTree:
    name: str = meta(schema=TREE)
    num_steps: int = meta(schema=AT_LEAST_ONE)
    topk: int = meta(schema=AT_LEAST_ONE)
    num_draft_tokens: int = meta(schema={"minimum": 2})
    source: str = meta()


@dataclass(frozen=True)
class SampledRun:
    """One run at temperature > 0 ([server] sampled), as diag/engines/sanity.Sampled reports it."""
    temperature: float = meta(schema=POSITIVE)
    accept_length: float = meta(schema=AT_LEAST_ONE)
    rounds: int | None = meta(schema=COUNT)
    depth: int | None = meta(schema=AT_LEAST_ONE)
    source: str = meta()

    @classmethod
    def of(cls, run) -> "SampledRun":
        """From a diag/engines/sanity.Sampled."""
        return cls(run.temperature, run.accept_length, run.rounds, run.depth, run.source)


@dataclass(frozen=True)
class Load:
    """How full the server ran: decode lines at the max_running_requests cap with requests queued."""
    lines: int = meta(schema=AT_LEAST_ONE)
    max_running_req: int = meta(schema=COUNT)
    max_queue_req: int = meta(schema=COUNT)
    lines_capped_with_queue: int = meta(schema=COUNT)


@dataclass(frozen=True)
class Observed:
    release: str = meta(schema=RELEASE)
    engine: str = meta()                           # as reports write it: "SGLang 0.5.8"
    sampled: tuple[SampledRun, ...] = meta()
    files: tuple[ServerFile, ...] = meta()
    accept_length: Reported | None = meta()
    also: tuple[Reported, ...] = meta()
    requests: tuple[Request, ...] = meta()
    tree: ServerTree | None = meta()
    draft_tokens: tuple[int, ...] | None = meta(schema={"items": {"minimum": 2}})
    rate_formula: str | None = meta()
    acceptance_at_depth: tuple[float, ...] | None = meta(schema={"items": RATE})
    tokens_per_second: float | None = meta()
    tokens_per_second_source: str | None = meta()
    run_accept_length: float | None = meta()
    baseline_tokens_per_second: float | None = meta()
    baseline_source: str | None = meta()
    concurrency: int | None = meta(schema=AT_LEAST_ONE)
    max_running_requests: int | None = meta(schema=AT_LEAST_ONE)
    max_running_requests_source: str = meta()
    load: Load | None = meta()
    notes: tuple[str, ...] = meta()


@dataclass(frozen=True)
class Match:
    """One candidate against the server (reconcile.Match as reported)."""
    key: str
    axes: dict = meta(schema=AXES)
    num_steps: int = meta(schema=AT_LEAST_ONE)
    topk: int = meta(schema=AT_LEAST_ONE)
    num_draft_tokens: int = meta(schema={"minimum": 2})
    accept_length: float = meta(schema=AT_LEAST_ONE)
    accept_length_ci95: tuple[float, float] = meta()
    shape_ok: bool = meta()
    shape_reason: str | None = meta()
    diag_value: float = meta()
    server_value: float = meta()
    difference: float = meta()
    difference_ci95: tuple[float, float] = meta()
    per_request_rms: float | None = meta()
    per_request_rms_ci95: tuple[float, float] | None = meta()
    explains: bool = meta()


@dataclass(frozen=True)
class Reconciliation:
    mode: str = meta(schema={"enum": ["per-request", "aggregate"]})
    server: Reported = meta()
    matches: tuple[Match, ...] = meta()            # best first: tree allowed, then by score
    explaining: tuple[str, ...] = meta()           # keys of the matches that explain the server
    closest: str | None = meta()                   # key of the best match whose tree is allowed


@dataclass(frozen=True)
class CalibratedCosts:
    t_decode_s: float = meta(schema=POSITIVE)
    round_s: float = meta(schema=POSITIVE)
    overhead_s: float = meta(schema=POSITIVE)
    t_draft_s_if_draft_bound: float = meta(schema=POSITIVE)
    t_token_s_if_verify_bound: float = meta(schema=POSITIVE)
    shape: str = meta(schema=TREE)
    break_even_accept_length: float = meta(schema=AT_LEAST_ONE)


@dataclass(frozen=True)
class PricedRow:
    """One candidate priced at the server's costs: (cheapest, dearest) over the two cost splits."""
    key: str
    axes: dict = meta(schema=AXES)
    tree: str = meta(schema=TREE)
    accept_length: float = meta(schema=AT_LEAST_ONE)
    round_s: tuple[float, float] = meta()
    tokens_per_second: tuple[float, float] = meta()
    speedup: tuple[float, float] = meta()
    break_even_accept_length: tuple[float, float] = meta()
    exact: bool = meta()                           # both splits agree


@dataclass(frozen=True)
class Calibration:
    basis: str = meta(schema={"const": "server"})
    baseline_tokens_per_second: float = meta(schema=POSITIVE)
    baseline_source: str = meta()
    tokens_per_second: float = meta(schema=POSITIVE)
    tokens_per_second_source: str = meta()
    accept_length: float = meta(schema=AT_LEAST_ONE)
    measured_speedup: float = meta(schema=POSITIVE)
    costs: CalibratedCosts = meta()
    rows: tuple[PricedRow, ...] = meta()


@dataclass(frozen=True)
class Concurrency:
    concurrency: int | None = meta(schema=AT_LEAST_ONE)    # the user's concurrent requests
    max_running_requests: int = meta(schema=AT_LEAST_ONE)
    source: str = meta()
    capped: bool = meta()
    served_fraction: float | None = meta()
    log: Load | None = meta()
    throughput_cost: float | None = meta()


@dataclass(frozen=True)
class SimulateRow:
    key: str
    tree: str = meta(schema=TREE)
    accept_length: float = meta(schema=AT_LEAST_ONE)
    engines: dict = spread()                       # every registered engine's fields (module docstring)
    notes: tuple[str, ...] = meta()


@dataclass(frozen=True)
class Sanity:
    verdict: str = meta(schema={"enum": ["ENGINE DEFECT", "OK", "NO VERDICT"]})
    engine: str = meta()
    greedy: float = meta()
    greedy_source: str = meta()
    lowest: SampledRun | None = meta()
    tolerance: float = meta(schema={"minimum": 0})
    message: str = meta()
