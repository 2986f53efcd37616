"""Prompt-level bootstrap: golden point estimates, determinism, coverage of a known effect."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from diag.errors import DiagError
from diag.stats import accept_length_ci, bootstrap_ci, paired_bootstrap_diff


def test_weighted_bootstrap_contains_pooled_value_and_is_seeded():
    lo, hi = bootstrap_ci([2.0, 3.0, 2.5, 1.5], weights=[1, 3, 2, 2], seed=1)
    pooled = (2 + 9 + 5 + 3) / 8
    assert lo <= pooled <= hi and lo < hi
    assert bootstrap_ci([2.0, 3.0, 2.5, 1.5], weights=[1, 3, 2, 2], seed=1) == (lo, hi)


def test_single_prompt_is_degenerate():
    assert bootstrap_ci([2.5], seed=0) == (2.5, 2.5)


def test_accept_length_ci_golden_point():
    point, lo, hi = accept_length_ci([[1, 2], [0]], seed=0)
    assert point == pytest.approx(2.0)
    assert lo <= point <= hi


def test_paired_diff_golden_and_constant_shift():
    point, lo, hi = paired_bootstrap_diff([[2, 2], [1]], [[1, 1], [0]], seed=0)
    assert point == pytest.approx(1.0)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)  # same shift on every prompt


def test_paired_diff_detects_real_difference_and_not_noise():
    rng = np.random.default_rng(0)
    base = [list(rng.integers(0, 4, size=20)) for _ in range(30)]
    better = [[min(3, x + 1) for x in r] for r in base]
    _, lo, _ = paired_bootstrap_diff(better, base, seed=3)
    assert lo > 0
    _, lo0, hi0 = paired_bootstrap_diff(base, base, seed=3)
    assert lo0 == pytest.approx(0.0) and hi0 == pytest.approx(0.0)


def test_errors():
    with pytest.raises(DiagError):
        bootstrap_ci([], seed=0)
    with pytest.raises(DiagError):
        paired_bootstrap_diff([[1]], [[1], [2]], seed=0)
    with pytest.raises(DiagError):
        bootstrap_ci([1.0, 2.0], weights=[1.0], seed=0)
    with pytest.raises(DiagError):
        bootstrap_ci([1.0, 2.0], seed=0, level=1.5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=8), min_size=1, max_size=8),
       st.integers(0, 1000))
def test_interval_within_range_of_prompt_values(rounds, seed):
    point, lo, hi = accept_length_ci(rounds, seed=seed, n=200)
    per_prompt = [1 + np.mean(r) for r in rounds]
    assert min(per_prompt) - 1e-9 <= lo <= hi <= max(per_prompt) + 1e-9
    assert min(per_prompt) - 1e-9 <= point <= max(per_prompt) + 1e-9
