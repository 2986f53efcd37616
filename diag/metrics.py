"""Acceptance counts and the metrics derived from them (DESIGN.md §6).

Counts are plain data; metrics are pure functions of the counts. The report,
the terminal table and the pytest plugin all read `summary(counts)`, so a
number means the same thing everywhere.

Per verify round, `a` = the number of accepted draft tokens (0..S). The bonus
token (the target's own next token, emitted every round) is NOT in `a`:
    accept_length = 1 + mean(a)   includes the bonus (SGLang "accept len",
                                  vLLM "mean acceptance length")
This module knows histograms of `a`; it knows nothing about trees, models,
trajectories or files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diag.errors import DiagError


@dataclass(frozen=True)
class AcceptCounts:
    """How many verify rounds accepted exactly i draft tokens, i = 0..S.

    `accepted_hist[i]` = number of rounds with a == i; len == num_steps + 1.
    Example: a = [0, 2, 2, 1] with S = 3 -> accepted_hist (1, 1, 2, 0), rounds 4.
    """

    num_steps: int
    num_draft_tokens: int
    rounds: int
    accepted_hist: tuple[int, ...]

    def __post_init__(self):
        if len(self.accepted_hist) != self.num_steps + 1:
            raise DiagError("acceptance histogram has the wrong length", field="accepted_hist",
                            expected=f"num_steps + 1 = {self.num_steps + 1} bins",
                            found=f"{len(self.accepted_hist)} bins")
        if sum(self.accepted_hist) != self.rounds or min(self.accepted_hist, default=0) < 0:
            raise DiagError("acceptance histogram does not add up to the round count",
                            field="accepted_hist", expected=f"non-negative bins summing to {self.rounds}",
                            found=list(self.accepted_hist))

    @classmethod
    def from_accepted(cls, accepted, num_steps: int, num_draft_tokens: int) -> "AcceptCounts":
        """Histogram of per-round accepted counts (tensor, array or list of ints)."""
        a = torch.as_tensor(accepted, dtype=torch.int64).reshape(-1)  # [R]
        if a.numel() and (int(a.min()) < 0 or int(a.max()) > num_steps):
            raise DiagError("accepted draft tokens out of range", field="accepted",
                            expected=f"0..{num_steps} (num_steps)",
                            found=f"{int(a.min())}..{int(a.max())}")
        hist = torch.bincount(a, minlength=num_steps + 1)  # [S+1]
        return cls(num_steps, num_draft_tokens, int(a.numel()), tuple(int(x) for x in hist))

    @classmethod
    def empty(cls, num_steps: int, num_draft_tokens: int) -> "AcceptCounts":
        return cls(num_steps, num_draft_tokens, 0, (0,) * (num_steps + 1))

    def to_dict(self) -> dict:
        return {"num_steps": self.num_steps, "num_draft_tokens": self.num_draft_tokens,
                "rounds": self.rounds, "accepted_hist": list(self.accepted_hist)}

    @classmethod
    def from_dict(cls, d: dict) -> "AcceptCounts":
        keys = ("num_steps", "num_draft_tokens", "rounds", "accepted_hist")
        missing = [k for k in keys if k not in d]
        if missing:
            raise DiagError("acceptance counts are missing fields", field=",".join(missing),
                            expected=list(keys), found=sorted(d))
        return cls(int(d["num_steps"]), int(d["num_draft_tokens"]), int(d["rounds"]),
                   tuple(int(x) for x in d["accepted_hist"]))


def merge(a: AcceptCounts, b: AcceptCounts) -> AcceptCounts:
    """Pool two sets of rounds of the same tree shape."""
    if (a.num_steps, a.num_draft_tokens) != (b.num_steps, b.num_draft_tokens):
        raise DiagError("cannot pool acceptance counts of different tree shapes",
                        expected=f"num_steps={a.num_steps}, num_draft_tokens={a.num_draft_tokens}",
                        found=f"num_steps={b.num_steps}, num_draft_tokens={b.num_draft_tokens}")
    hist = tuple(x + y for x, y in zip(a.accepted_hist, b.accepted_hist))
    return AcceptCounts(a.num_steps, a.num_draft_tokens, a.rounds + b.rounds, hist)


def _sum_accepted(c: AcceptCounts) -> int:
    """Σa over rounds: Σ_i i · hist[i]."""
    return sum(i * n for i, n in enumerate(c.accepted_hist))


def accept_length(c: AcceptCounts) -> float | None:
    """1 + mean(a): tokens emitted per verify round, bonus token INCLUDED.
    SGLang's "accept len" and vLLM's "mean acceptance length". None with 0 rounds.
    Example: a = [0, 2, 2, 1] -> 1 + 5/4 = 2.25."""
    return None if c.rounds == 0 else 1.0 + _sum_accepted(c) / c.rounds


def accept_length_no_bonus(c: AcceptCounts) -> float | None:
    """mean(a): accepted draft tokens per round, bonus EXCLUDED.
    SpecForge's `simulated_acc_len`. Example: a = [0, 2, 2, 1] -> 1.25."""
    return None if c.rounds == 0 else _sum_accepted(c) / c.rounds


def draft_accept_rate(c: AcceptCounts) -> float | None:
    """Σa / (rounds · (D-1)), drafted slots only, bonus excluded: the "accept rate" SGLang
    0.5.11–0.5.23 logs; vLLM logs it as "Draft acceptance rate" (num_accepted_tokens /
    num_draft_tokens: a chain of k drafts has D - 1 = k slots). Which engine release logs which
    rate is the engine's (EngineRules.report_rates, accept_rate_formula).
    Example: a = [0, 2, 2, 1], D = 4 -> 5 / 12 = 0.4167. None with 0 rounds or D = 1."""
    slots = c.rounds * (c.num_draft_tokens - 1)
    return None if slots <= 0 else _sum_accepted(c) / slots


def bonus_accept_rate(c: AcceptCounts) -> float | None:
    """Σ(a+1) / (rounds · D), the bonus token counted in both numerator and denominator: the
    "accept rate" SGLang 0.5.6–0.5.10.post1 logs. Example: a = [0, 2, 2, 1], D = 4 ->
    9 / 16 = 0.5625. None with 0 rounds."""
    slots = c.rounds * c.num_draft_tokens
    return None if slots <= 0 else (_sum_accepted(c) + c.rounds) / slots


def _at_least(c: AcceptCounts) -> list[int]:
    """Rounds with a >= i, for i = 0..S. hist (1,1,2,0) -> [4, 3, 2, 0]."""
    out, running = [], c.rounds
    for n in c.accepted_hist:
        out.append(running)
        running -= n
    return out


def acceptance_at_depth(c: AcceptCounts) -> list[float | None]:
    """[i-1] = P(a >= i) for depth i = 1..S: the unconditional per-position
    acceptance vLLM logs (num_accepted_tokens_per_pos / num_drafts).
    Example: a = [0, 2, 2, 1] -> [3/4, 2/4, 0/4]. Nones with 0 rounds."""
    ge = _at_least(c)
    return [None if c.rounds == 0 else ge[i] / c.rounds for i in range(1, c.num_steps + 1)]


def conditional_acceptance(c: AcceptCounts) -> list[float | None]:
    """[i-1] = P(a >= i | a >= i-1) for depth i = 1..S: how often depth i is
    accepted given depth i-1 was (the drafter's per-step quality). None where
    no round reached depth i-1. Example: a = [0, 2, 2, 1] -> [3/4, 2/3, 0/2]."""
    ge = _at_least(c)
    return [None if ge[i - 1] == 0 else ge[i] / ge[i - 1] for i in range(1, c.num_steps + 1)]


def summary(c: AcceptCounts, rates: tuple[tuple[str, Callable[[AcceptCounts], float | None]], ...] = ()) -> dict:
    """Every metric by its DESIGN §6 name, plus the counts they came from; `rates` adds the
    engines' own accept rates, (report field, rate function) each, after the accept lengths
    (diag.engines.report_rates() gives them: "sglang_accept_rate" -> draft_accept_rate, ...)."""
    return {
        "rounds": c.rounds,
        "num_steps": c.num_steps,
        "num_draft_tokens": c.num_draft_tokens,
        "accepted_hist": list(c.accepted_hist),
        "accept_length": accept_length(c),
        "accept_length_no_bonus": accept_length_no_bonus(c),
        **{field: rate(c) for field, rate in rates},
        "acceptance_at_depth": acceptance_at_depth(c),
        "conditional_acceptance": conditional_acceptance(c),
    }


def bucketed(accepted, positions, edges, *, num_steps: int,
             num_draft_tokens: int) -> list[AcceptCounts]:
    """Acceptance by absolute position in the sequence: bucket b holds the
    rounds whose root position p satisfies edges[b] <= p < edges[b+1];
    rounds outside [edges[0], edges[-1]) are left out. Falling acceptance at
    long positions points at RoPE / context-length mismatches.
    Example: accepted [1, 2, 0, 3], positions [5, 40, 70, 130], edges
    [0, 64, 128] -> bucket 0 gets a = [1, 2], bucket 1 gets a = [0]."""
    a = torch.as_tensor(accepted, dtype=torch.int64).reshape(-1)  # [P]
    pos = torch.as_tensor(positions, dtype=torch.int64).reshape(-1)  # [P]
    e = [int(x) for x in edges]
    if len(e) < 2 or any(x >= y for x, y in zip(e, e[1:])):
        raise DiagError("bucket edges must be at least two strictly increasing positions",
                        field="edges", expected="e.g. [0, 512, 1024, 2048]", found=e)
    if a.shape != pos.shape:
        raise DiagError("accepted and positions differ in length", field="positions",
                        expected=list(a.shape), found=list(pos.shape))
    return [AcceptCounts.from_accepted(a[(pos >= lo) & (pos < hi)], num_steps, num_draft_tokens)
            for lo, hi in zip(e, e[1:])]
