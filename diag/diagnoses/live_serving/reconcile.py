"""Which of diag's evaluated candidates explains what the live server reported.

Candidates: every Evaluation with verify rounds whose features and verifying tokens come from
one regime (a cross-regime variant is a diagnostic construct no server runs), whatever its
other axes (layout, mode, tree, regime, and any axis added later): the rows carry
`axes.as_dict()`, nothing here names an axis but the two regimes.

A candidate whose tree the server's sources rule out (another (S, K, D), or a D outside the
consistent set) cannot explain the server, whatever its accept length. Among the others:
- per request (responses paired with the case's prompts): each prompt's accept length
  1 + Σa/R under the candidate against the server's; the score is their RMS difference,
  weighted by the server's rounds. A candidate explains the server when its RMS is
  indistinguishable from the best one's (paired bootstrap over prompts: the 95% interval of
  the RMS difference reaches 0) and the 95% interval of its pooled difference includes 0.
- aggregate (a log, counters, /server_info): Δ = diag − server, interval ±sqrt(h_diag² + h_server²)
  from the two half-widths; a candidate explains the server when that interval includes 0.
Worked example (aggregate): server 1.68 [1.66, 1.70], candidate 1.64 [1.58, 1.70] -> Δ -0.04,
half-width sqrt(0.06² + 0.02²) = 0.063: explains. The same candidate at D = 4 when the log
pins D = 2: ruled out.
When no candidate explains the server, the gap lies outside what diag varied: in the engine
(prefix cache, kernels, tensor-parallel numerics), in sampling, or in the continuation.

This module is pure: Evaluation records and a ServerObservation in, a Reconciliation out (its
report.json form: parts.Reconciliation, by `report()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diag.diagnoses.live_serving import parts
from diag.replay.evaluation import Evaluation
from diag.diagnoses.live_serving.observation import Observed, ServerObservation


@dataclass(frozen=True)
class Match:
    evaluation: Evaluation
    shape_ok: bool
    shape_reason: str | None           # why the server's sources rule this tree out
    diag_value: float                  # the candidate's accept length on what is compared
    server_value: float
    difference: float                  # diag - server
    difference_ci95: tuple[float, float]
    rms: float | None                  # per request only
    rms_ci95: tuple[float, float] | None
    explains: bool

    def row(self) -> parts.Match:
        """This match as report.json holds it (parts.Match), keyed and labelled like its evaluation."""
        e = self.evaluation
        return parts.Match(e.key, e.axes.as_dict(), e.shape.num_steps, e.shape.topk, e.shape.num_draft_tokens,
                           e.accept_length, tuple(e.accept_length_ci95), self.shape_ok, self.shape_reason,
                           self.diag_value, self.server_value, self.difference, tuple(self.difference_ci95),
                           self.rms, None if self.rms_ci95 is None else tuple(self.rms_ci95), self.explains)


@dataclass(frozen=True)
class Reconciliation:
    mode: str                          # "per-request" | "aggregate"
    server: Observed
    matches: tuple[Match, ...]         # best first: tree allowed, then by score

    @property
    def explaining(self) -> tuple[Match, ...]:
        return tuple(m for m in self.matches if m.explains)

    @property
    def closest(self) -> Match | None:
        return next((m for m in self.matches if m.shape_ok), None)

    def report(self) -> parts.Reconciliation:
        """The section's `reconciliation` part (parts.Reconciliation)."""
        return parts.Reconciliation(self.mode, self.server.reported(), tuple(m.row() for m in self.matches),
                                    tuple(m.evaluation.key for m in self.explaining),
                                    self.closest.evaluation.key if self.closest else None)


def servable(e: Evaluation) -> bool:
    return e.accept_length is not None and e.axes.regime == e.axes.tokens_regime


def shape_check(e: Evaluation, obs: ServerObservation) -> str | None:
    """None when the server's sources allow this candidate's tree, else why not."""
    if obs.shape is not None and e.shape != obs.shape:
        return f"the server ran {obs.shape.name} ({obs.shape_source}), not {e.shape.name}"
    if obs.draft_tokens is not None and e.shape.num_draft_tokens not in obs.draft_tokens:
        return f"the server verifies D in {list(obs.draft_tokens)[:6]} tokens per round, not {e.shape.num_draft_tokens}"
    return None


def _half(lo: float, hi: float) -> float:
    return (hi - lo) / 2.0


def _aggregate(evals: list[Evaluation], obs: ServerObservation) -> list[Match]:
    srv = obs.accept_length
    out = []
    for e in evals:
        lo, hi = e.accept_length_ci95
        h = float(np.hypot(_half(lo, hi), _half(srv.lo, srv.hi)))
        d = e.accept_length - srv.value
        reason = shape_check(e, obs)
        out.append(Match(e, reason is None, reason, e.accept_length, srv.value, d, (d - h, d + h), None, None,
                         reason is None and d - h <= 0 <= d + h))
    return sorted(out, key=lambda m: (not m.shape_ok, abs(m.difference)))


def _paired(e: Evaluation, obs: ServerObservation) -> tuple[np.ndarray, np.ndarray]:
    """[P, 2] (Σa, R) of the candidate and of the server, on the prompts both have rounds for."""
    mine = {p.id: (p.accepted_sum, p.rounds) for p in e.per_prompt}
    rows = [(mine[r.id], (r.accepted_sum, r.rounds)) for r in obs.requests if r.rounds and mine.get(r.id, (0, 0))[1]]
    c = np.array([a for a, _ in rows], dtype=float).reshape(-1, 2)
    s = np.array([b for _, b in rows], dtype=float).reshape(-1, 2)
    return c, s


def _stats(c: np.ndarray, s: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per resample (rows of idx [n, P]): pooled difference and round-weighted RMS difference."""
    pooled = c[idx, 0].sum(1) / c[idx, 1].sum(1) - s[idx, 0].sum(1) / s[idx, 1].sum(1)
    err = c[:, 0] / c[:, 1] - s[:, 0] / s[:, 1]                          # [P] per-prompt difference
    w = s[:, 1]
    rms = np.sqrt((w[idx] * err[idx] ** 2).sum(1) / w[idx].sum(1))
    return pooled, rms


def _per_request(evals: list[Evaluation], obs: ServerObservation, seed: int, n_boot: int) -> list[Match]:
    pairs = {e.key: _paired(e, obs) for e in evals}
    size = max(len(c) for c, _ in pairs.values())
    idx = np.random.default_rng(seed).integers(0, size, size=(n_boot, size))
    whole = np.arange(size)[None]
    found = {}
    for e in evals:
        c, s = pairs[e.key]
        if len(c) != size:                    # a candidate without rounds on some paired prompt
            continue
        (d,), (r,) = _stats(c, s, whole)
        boot_d, boot_r = _stats(c, s, idx)
        found[e.key] = (e, float(d), float(r), boot_d, boot_r)
    allowed = [k for k, v in found.items() if shape_check(v[0], obs) is None]
    best = min(allowed, key=lambda k: found[k][2]) if allowed else None
    out = []
    for k, (e, d, r, boot_d, boot_r) in found.items():
        reason = shape_check(e, obs)
        d_ci = tuple(float(x) for x in np.percentile(boot_d, [2.5, 97.5]))
        r_ci = tuple(float(x) for x in np.percentile(boot_r, [2.5, 97.5]))
        near = best is not None and (k == best or np.percentile(boot_r - found[best][4], 2.5) <= 0)
        c, s = pairs[k]
        out.append(Match(e, reason is None, reason, 1 + c[:, 0].sum() / c[:, 1].sum(),
                         1 + s[:, 0].sum() / s[:, 1].sum(), d, d_ci, r, r_ci,
                         reason is None and near and d_ci[0] <= 0 <= d_ci[1]))
    return sorted(out, key=lambda m: (not m.shape_ok, m.rms))


def reconcile(evaluations, obs: ServerObservation, *, seed: int = 0, n_boot: int = 2000) -> Reconciliation | None:
    """Rank every servable candidate by how well it explains the server (module docstring);
    None when the server reported no accept length."""
    evals = [e for e in evaluations if servable(e)]
    if obs.accept_length is None or not evals:
        return None
    if obs.requests:
        matches = _per_request(evals, obs, seed, n_boot)
        if matches:
            return Reconciliation("per-request", obs.accept_length, tuple(matches))
    return Reconciliation("aggregate", obs.accept_length, tuple(_aggregate(evals, obs)))
