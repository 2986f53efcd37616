"""The speedup model calibrated from the live server: its costs per round and per token from a
baseline tok/s and a speculative tok/s, then every evaluated shape priced with them.

From a plain run at B tok/s and a speculative run at T tok/s, accept length L, tree (S0, K0, D0),
both at the same concurrency:
    t_decode = 1 / B                     per token, plain decoding
    round    = L / T                     per verify round, as the server ran it
    overhead = round - t_decode = S0·t_draft + (D0 - 1)·t_token
    break-even accept length on (S0, K0, D0) = round / t_decode = B·L / T
One measurement cannot split the overhead between drafting (t_draft per draft step) and
verifying (t_token per extra verified token), so another shape (S, D) costs between
    t_decode + S·overhead/S0        (all of it drafting)   and
    t_decode + (D-1)·overhead/(D0-1) (all of it verifying)
and both bounds are reported. They coincide for every shape with S/S0 = (D-1)/(D0-1); when
the server ran a chain, every chain is priced exactly.
Worked example (the seed): B 90, T 82.3, L 2.2 on s3-k4-d5 -> t_decode 11.11 ms, round
26.73 ms, overhead 15.62 ms, break-even 2.41 (speculation runs at 0.91x); chain-1 would cost
between 15.01 ms (verify-bound) and 16.32 ms (draft-bound) per round.
A round no dearer than a plain step (overhead <= 0) cannot happen: every round runs a verify of
D >= 2 tokens, which costs at least a decode step. It is a measurement error (the two rates were
taken at different concurrency, prompts or hardware), never a result.

Concurrency: in speculative mode SGLang caps running requests at max_running_requests (48 unless
set); with C > cap concurrent requests, cap run and C - cap queue, so the aggregate throughput is
at most cap / C of what C slots would give at the same per-request speed.

This module is pure arithmetic over Evaluation records and the server's numbers; what it returns
is typed as report.json holds it (parts.Calibration, parts.Concurrency).
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.diagnoses.live_serving import parts
from diag.errors import DiagError
from diag.trees import TreeShape


@dataclass(frozen=True)
class ServerCosts:
    t_decode: float          # seconds per plain decode step
    round: float             # seconds per verify round on the measured shape
    overhead: float          # round - t_decode
    shape: TreeShape         # the measured shape

    def round_bounds(self, shape: TreeShape) -> tuple[float, float]:
        """(cheapest, dearest) round cost of another shape under the two splits of the overhead."""
        draft = self.t_decode + shape.num_steps * self.overhead / self.shape.num_steps
        verify = self.t_decode + (shape.num_draft_tokens - 1) * self.overhead / (self.shape.num_draft_tokens - 1)
        return min(draft, verify), max(draft, verify)

    @property
    def break_even(self) -> float:
        return self.round / self.t_decode

    def report(self) -> parts.CalibratedCosts:
        return parts.CalibratedCosts(self.t_decode, self.round, self.overhead, self.overhead / self.shape.num_steps,
                                     self.overhead / (self.shape.num_draft_tokens - 1), self.shape.name,
                                     self.break_even)


def server_costs(baseline_tps: float, spec_tps: float, accept_length: float, shape: TreeShape) -> ServerCosts:
    """The server's costs (module docstring); a speculative round cheaper than a plain step is an error."""
    t_decode, rnd = 1.0 / baseline_tps, accept_length / spec_tps
    if rnd <= t_decode:
        raise DiagError("the server's numbers give a speculative round cheaper than one plain decode step: "
                        "a measurement error", field="server.tokens_per_second",
                        expected=f"tokens_per_second < accept_length x baseline = {accept_length:.2f} x "
                                 f"{baseline_tps:.1f} = {accept_length * baseline_tps:.1f} (break-even >= 1)",
                        found=f"{spec_tps:.1f} tok/s at accept length {accept_length:.2f} ({shape.name}): break-even "
                              f"{rnd / t_decode:.2f}",
                        hint="measure both rates at the same concurrency, prompts and max_new_tokens")
    return ServerCosts(t_decode, rnd, rnd - t_decode, shape)


def price(evaluations, costs: ServerCosts, baseline_tps: float) -> tuple[parts.PricedRow, ...]:
    """Every evaluation with rounds, priced: tok/s and speedup as (low, high) over the cost split."""
    rows = []
    for e in evaluations:
        if e.accept_length is None or e.axes.regime != e.axes.tokens_regime:
            continue
        cheap, dear = costs.round_bounds(e.shape)
        lo, hi = e.accept_length / dear, e.accept_length / cheap
        rows.append(parts.PricedRow(e.key, e.axes.as_dict(), e.shape.name, e.accept_length, (cheap, dear), (lo, hi),
                                    (lo / baseline_tps, hi / baseline_tps),
                                    (cheap / costs.t_decode, dear / costs.t_decode), abs(dear - cheap) < 1e-12))
    return tuple(rows)


def concurrency(users: int | None, cap: int, cap_source: str, load) -> parts.Concurrency | None:
    """What the max_running_requests cap costs at the user's concurrency (module docstring)."""
    if users is None and load is None:
        return None
    served = None if users is None else min(1.0, cap / users)
    return parts.Concurrency(users, cap, cap_source, users is not None and users > cap, served, load,
                             None if users is None else 1.0 - served)


def calibration(obs, evaluations) -> parts.Calibration | None:
    """The server-calibrated speedup section, or None when a rate, the accept length or the tree is unknown."""
    if None in (obs.baseline_tokens_per_second, obs.tokens_per_second, obs.run_accept_length) or obs.shape is None:
        return None
    costs = server_costs(obs.baseline_tokens_per_second, obs.tokens_per_second, obs.run_accept_length, obs.shape)
    return parts.Calibration("server", obs.baseline_tokens_per_second, obs.baseline_source, obs.tokens_per_second,
                             obs.tokens_per_second_source, obs.run_accept_length,
                             obs.tokens_per_second / obs.baseline_tokens_per_second, costs.report(),
                             price(evaluations, costs, obs.baseline_tokens_per_second))
