"""The server's numbers as one typed record, and the rules that combine several sources of them.

Sources (diag/engines readers): the scheduler log, /generate responses, /server_info, vLLM's
/metrics, the case's [server] values and its launch command. Combining them:
- the tree the server ran: every source that names a full (S, K, D) must agree (an explicit
  [server] tree, the log's server_args line, /server_info, vLLM's K as a chain, the launch
  command read with SGLang's rules); the responses' D and the D values that make every log
  line's accept len and accept rate consistent under the release's formula must contain it.
  Worked example: "accept len: 1.68, accept rate: 0.84" from 0.5.8 (legacy formula L / D)
  fits D = 2 only; from 0.5.11 on ((L - 1) / (D - 1)) it fits no D at all: an error that
  names the release that could have printed it.
- the aggregate accept length matched against diag's candidates, most specific first:
  per-request responses (pooled, interval by bootstrap over requests), log lines (pooled,
  weighted by #running-req, bootstrap over lines, widened by the printed rounding ±0.005),
  vLLM counters, /server_info; the others are kept as `also`.

This module knows records and arithmetic; reading files is inputs.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diag.diagnoses.live_serving import parts
from diag.diagnoses.live_serving.parts import Load as LogLoad
from diag.engines.sanity import Sampled
from diag.errors import DiagError
from diag.stats import accept_length_ci, bootstrap_ci
from diag.trees import TreeShape

ROUNDING = 0.005        # SGLang prints accept len with 2 decimals


@dataclass(frozen=True)
class Observed:
    """One accept length the server reported, its 95% interval, and where it came from."""

    value: float
    lo: float
    hi: float
    source: str

    def reported(self) -> parts.Reported:
        return parts.Reported(self.value, (self.lo, self.hi), self.source)


@dataclass(frozen=True)
class ServerObservation:
    release: str                                  # "0.5.8": the release that wrote the files
    files: tuple[tuple[str, str], ...]            # (kind, path)
    accept_length: Observed | None                # the aggregate the candidates are matched on
    also: tuple[Observed, ...]                    # other aggregates, reported only
    requests: tuple                               # the engine's per-request counts, in prompt order
    shape: TreeShape | None                       # the tree the server ran, when a source says
    shape_source: str | None
    draft_tokens: tuple[int, ...] | None          # D values consistent with every source (None: any)
    rate_formula: str | None
    acceptance_at_depth: tuple[float, ...] | None  # vLLM per position
    tokens_per_second: float | None               # speculative, as measured by the user or the log
    tokens_per_second_source: str | None
    run_accept_length: float | None               # accept length of the run that measured it
    baseline_tokens_per_second: float | None
    baseline_source: str | None
    concurrency: int | None
    max_running_requests: int | None              # None: the engine's cap is not known
    max_running_requests_source: str
    load: LogLoad | None
    notes: tuple[str, ...]
    engine: str = ""                              # the release's name: "sglang-0.5.8", "vllm-0.32.0"
    engine_label: str = ""                        # how reports write it: "SGLang 0.5.8"
    sampled: tuple[Sampled, ...] = ()             # runs at T > 0 ([server] sampled), lowest T first

    def report(self) -> parts.Observed:
        """The section's `observed` part (parts.Observed): what the server reported, as report.json holds it."""
        s = self.shape
        return parts.Observed(
            self.release, self.engine_label,
            tuple(parts.SampledRun.of(x) for x in self.sampled),
            tuple(parts.ServerFile(k, p) for k, p in self.files),
            self.accept_length.reported() if self.accept_length else None, tuple(o.reported() for o in self.also),
            tuple(parts.Request(r.id, r.rounds, r.accepted_sum, r.completion_tokens) for r in self.requests),
            None if s is None else parts.ServerTree(s.name, s.num_steps, s.topk, s.num_draft_tokens, self.shape_source),
            self.draft_tokens, self.rate_formula, self.acceptance_at_depth, self.tokens_per_second,
            self.tokens_per_second_source, self.run_accept_length, self.baseline_tokens_per_second,
            self.baseline_source, self.concurrency, self.max_running_requests, self.max_running_requests_source,
            self.load, self.notes)


# ---- accept lengths ---------------------------------------------------------------------

def pooled_log(lines: tuple, *, seed: int, n_boot: int) -> Observed:
    """Accept length over the log's speculative lines, weighted by #running-req (each interval
    adds one round per running request and forward pass). Example: lines (8 req, 1.60) and
    (24 req, 1.70) -> (8·1.60 + 24·1.70) / 32 = 1.675."""
    v = np.array([d.accept_len for d in lines])
    w = np.array([max(d.running_req, 1) for d in lines], dtype=float)
    point = float((v * w).sum() / w.sum())
    lo, hi = bootstrap_ci(v, seed=seed, n=n_boot, weights=w) if len(v) > 1 else (point, point)
    return Observed(point, lo - ROUNDING, hi + ROUNDING, f"scheduler log, {len(lines)} decode lines")


def pooled_requests(requests: tuple, *, seed: int, n_boot: int) -> Observed:
    """1 + ΣΣa / ΣR over the requests, interval by bootstrap over requests."""
    rounds = [[r.accepted_sum] + [0] * (r.rounds - 1) for r in requests if r.rounds]
    if not rounds:
        raise DiagError("no /generate response has a verify round", field="meta_info.spec_verify_ct",
                        expected="> 0 for some request", found=0)
    point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot)
    return Observed(point, lo, hi, f"/generate responses, {len(rounds)} requests")


# ---- the tree ----------------------------------------------------------------------------

def log_draft_tokens(lines: tuple, formula: str, release: str, source: str, pairs) -> tuple[int, ...]:
    """The D values for which every line's printed (accept len, accept rate) is consistent
    under `formula` (rounding included, 1 <= L <= D). None fits: an error naming the line and
    the release (`release`: as reports write it, e.g. "SGLang 0.5.23"). `pairs(accept_len,
    accept_rate)`: the (D, formula) that fit one line (EngineRules.log_draft_tokens)."""
    common: set[int] | None = None
    for d in lines:
        fits = {k for k, f in pairs(d.accept_len, d.accept_rate) if f == formula}
        if not fits:
            other = sorted({k for k, f in pairs(d.accept_len, d.accept_rate) if f != formula})
            raise DiagError("a log line's accept len and accept rate fit no tree under its release's formula",
                            file=source, field=f"line {d.line_no}",
                            expected=f"rate = {formula} for some D ({release})",
                            found=f"accept len {d.accept_len:.2f}, accept rate {d.accept_rate:.2f}"
                                  + (f"; the other formula fits D = {other[:4]}" if other else ""),
                            hint="set [server] engine to the release that wrote the log")
        common = fits if common is None else common & fits
        if not common:
            raise DiagError("the log's lines need different trees: two configurations in one file", file=source,
                            field=f"line {d.line_no}", expected="one num_draft_tokens for every line",
                            found=f"accept len {d.accept_len:.2f}, accept rate {d.accept_rate:.2f}",
                            hint="split the log at the restart")
    return tuple(sorted(common or ()))


def agree_on_shape(named: list[tuple[str, TreeShape]], draft_sets: list[tuple[str, tuple[int, ...]]]):
    """(shape, its source, consistent D values). Every named shape must be equal, and every D set
    must contain its D; with no named shape the D sets intersect."""
    shape, where = (named[0][1], named[0][0]) if named else (None, None)
    for src, other in named[1:]:
        if other != shape:
            raise DiagError("the server's sources disagree on the tree it ran", field=src,
                            expected=f"{shape.name} (from {where})", found=other.name,
                            hint="give the files of one server launch")
    ds: set[int] | None = None
    for src, d in draft_sets:
        if shape is not None and shape.num_draft_tokens not in d:
            raise DiagError("the server's sources disagree on the tree it ran", field=src,
                            expected=f"num_draft_tokens {shape.num_draft_tokens} ({shape.name}, from {where})",
                            found=f"num_draft_tokens in {list(d)[:6]}")
        ds = set(d) if ds is None else ds & set(d)
        if not ds:
            raise DiagError("the server's sources disagree on num_draft_tokens", field=src,
                            expected="one D for every source", found=f"{list(d)[:6]} after the others")
    if shape is not None:
        return shape, where, (shape.num_draft_tokens,)
    return None, None, (None if ds is None else tuple(sorted(ds)))
