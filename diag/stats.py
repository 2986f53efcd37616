"""Confidence intervals over prompts (DESIGN.md §9, §10).

Rounds within one prompt are correlated (a drafter that fits a prompt fits
most of its rounds), so the unit of resampling is the prompt, never the round.
Accept length over a resample is pooled: 1 + Σa / (number of rounds) across
the drawn prompts, the way a server log pools its rounds.

Intervals are percentile bootstrap intervals from a seeded numpy Generator,
so the same input and seed give the same interval on every machine.
This module knows arrays of numbers; it knows nothing about trees or models.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from diag.errors import DiagError


def _draws(num_prompts: int, n: int, seed: int) -> np.ndarray:
    """[n, P] prompt indices drawn with replacement."""
    if num_prompts == 0:
        raise DiagError("no prompts to resample", field="prompts",
                        expected="at least one prompt", found=0)
    return np.random.default_rng(seed).integers(0, num_prompts, size=(n, num_prompts))


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    if not 0.0 < level < 1.0:
        raise DiagError("confidence level must lie strictly between 0 and 1",
                        field="level", expected="e.g. 0.95", found=level)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return float(lo), float(hi)


def bootstrap_ci(per_prompt_values: Sequence[float], *, seed: int, n: int = 2000,
                 level: float = 0.95, weights: Sequence[float] | None = None) -> tuple[float, float]:
    """Percentile interval of the (weighted) mean over prompts, resampling prompts.

    With weights w (e.g. rounds per prompt) the statistic is Σ v·w / Σ w, so
    per-prompt accept lengths weighted by rounds give the pooled accept length.
    Example: values [2.0, 3.0], weights [1, 3] -> statistic 2.75 on the data.
    A single prompt gives lo == hi == its value.
    """
    v = np.asarray(per_prompt_values, dtype=np.float64)  # [P]
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)  # [P]
    if w.shape != v.shape:
        raise DiagError("one weight per prompt is needed", field="weights",
                        expected=list(v.shape), found=list(w.shape))
    idx = _draws(len(v), n, seed)  # [n, P]
    den = w[idx].sum(axis=1)  # [n]
    stat = (v[idx] * w[idx]).sum(axis=1) / np.where(den > 0, den, 1.0)
    return _percentiles(stat[den > 0], level)


def _per_prompt_sums(rounds_by_prompt: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(Σa per prompt [P], rounds per prompt [P])."""
    sums = np.array([float(np.sum(r)) for r in rounds_by_prompt], dtype=np.float64)
    counts = np.array([len(r) for r in rounds_by_prompt], dtype=np.float64)
    return sums, counts


def _pooled_accept_length(sums: np.ndarray, counts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """1 + Σa / rounds over the prompts each row of idx [n, P] draws -> [n].
    A resample with no rounds at all gives NaN."""
    den = counts[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.0 + sums[idx].sum(axis=1) / den


def accept_length_ci(rounds_by_prompt: Sequence[Sequence[int]], *, seed: int, n: int = 2000,
                     level: float = 0.95) -> tuple[float, float, float]:
    """(pooled accept length, lo, hi) from accepted counts per round, per prompt.
    Example: prompts [[1, 2], [0]] -> 1 + 3/3 = 2.0 on the data."""
    sums, counts = _per_prompt_sums(rounds_by_prompt)
    if counts.sum() == 0:
        raise DiagError("no verify rounds to summarise", field="rounds",
                        expected="at least one round", found=0)
    point = 1.0 + sums.sum() / counts.sum()
    stat = _pooled_accept_length(sums, counts, _draws(len(sums), n, seed))
    lo, hi = _percentiles(stat[~np.isnan(stat)], level)
    return float(point), lo, hi


def paired_bootstrap_diff(a_rounds_by_prompt: Sequence[Sequence[int]],
                          b_rounds_by_prompt: Sequence[Sequence[int]], *, seed: int,
                          n: int = 2000, level: float = 0.95) -> tuple[float, float, float]:
    """(accept_length(A) - accept_length(B), lo, hi), resampling the SAME prompts
    for both arms, so per-prompt difficulty cancels. A and B may have different
    round counts per prompt (different trajectories); each arm pools its own.
    Example: A [[2, 2], [1]], B [[1, 1], [0]] -> 1 + 5/3 - (1 + 2/3) = 1.0.
    The interval excluding 0 is the evidence that A and B differ."""
    if len(a_rounds_by_prompt) != len(b_rounds_by_prompt):
        raise DiagError("paired comparison needs the same prompts in both arms", field="prompts",
                        expected=len(a_rounds_by_prompt), found=len(b_rounds_by_prompt))
    sa, ca = _per_prompt_sums(a_rounds_by_prompt)
    sb, cb = _per_prompt_sums(b_rounds_by_prompt)
    if ca.sum() == 0 or cb.sum() == 0:
        raise DiagError("an arm of the comparison has no verify rounds", field="rounds",
                        expected="at least one round per arm", found=(int(ca.sum()), int(cb.sum())))
    point = (sa.sum() / ca.sum()) - (sb.sum() / cb.sum())
    idx = _draws(len(sa), n, seed)  # [n, P]
    diff = _pooled_accept_length(sa, ca, idx) - _pooled_accept_length(sb, cb, idx)
    lo, hi = _percentiles(diff[~np.isnan(diff)], level)
    return float(point), lo, hi
