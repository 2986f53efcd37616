"""Metrics on hand-built accepted arrays: exact values, bonus conventions, round trips."""

import math

import pytest
import torch
from hypothesis import given, strategies as st

from diag.errors import DiagError
from diag.metrics import (AcceptCounts, accept_length, accept_length_no_bonus, acceptance_at_depth,
                          bucketed, conditional_acceptance, merge, draft_accept_rate,
                          bonus_accept_rate, summary)


def test_golden_values_s3_d4():
    c = AcceptCounts.from_accepted([0, 2, 2, 1], num_steps=3, num_draft_tokens=4)
    assert c.accepted_hist == (1, 1, 2, 0) and c.rounds == 4
    assert accept_length(c) == pytest.approx(2.25)          # bonus included
    assert accept_length_no_bonus(c) == pytest.approx(1.25)  # SpecForge simulated_acc_len
    assert draft_accept_rate(c) == pytest.approx(5 / 12)
    assert bonus_accept_rate(c) == pytest.approx(9 / 16)
    assert acceptance_at_depth(c) == pytest.approx([0.75, 0.5, 0.0])
    assert conditional_acceptance(c) == pytest.approx([0.75, 2 / 3, 0.0])


def test_seed_example_reconciles_only_with_two_slots():
    # 68 of 100 rounds accept the one draft token: accept len 1.68.
    c = AcceptCounts.from_accepted([1] * 68 + [0] * 32, num_steps=1, num_draft_tokens=2)
    assert accept_length(c) == pytest.approx(1.68)
    assert bonus_accept_rate(c) == pytest.approx(0.84)
    assert draft_accept_rate(c) == pytest.approx(0.68)


def test_undefined_metrics_are_none():
    c = AcceptCounts.empty(num_steps=2, num_draft_tokens=3)
    assert accept_length(c) is None and draft_accept_rate(c) is None
    assert acceptance_at_depth(c) == [None, None]
    d = AcceptCounts.from_accepted([0, 0], num_steps=2, num_draft_tokens=3)
    assert conditional_acceptance(d) == [0.0, None]  # nobody reached depth 1
    one = AcceptCounts.from_accepted([0], num_steps=0, num_draft_tokens=1)
    assert draft_accept_rate(one) is None and accept_length(one) == 1.0


def test_out_of_range_and_bad_dict_raise():
    with pytest.raises(DiagError):
        AcceptCounts.from_accepted([0, 4], num_steps=3, num_draft_tokens=4)
    with pytest.raises(DiagError):
        AcceptCounts.from_dict({"num_steps": 1, "rounds": 1, "accepted_hist": [1, 0]})
    with pytest.raises(DiagError):
        AcceptCounts(1, 2, 3, (1, 1))
    with pytest.raises(DiagError):
        merge(AcceptCounts.empty(1, 2), AcceptCounts.empty(2, 3))


def test_bucketed_by_position():
    b = bucketed([1, 2, 0, 3], [5, 40, 70, 130], [0, 64, 128], num_steps=3, num_draft_tokens=4)
    assert [x.accepted_hist for x in b] == [(0, 1, 1, 0), (1, 0, 0, 0)]
    with pytest.raises(DiagError):
        bucketed([1], [5], [64, 0], num_steps=3, num_draft_tokens=4)


accepted_lists = st.integers(1, 5).flatmap(
    lambda s: st.tuples(st.just(s), st.lists(st.integers(0, s), max_size=40)))


@given(accepted_lists, st.integers(0, 20))
def test_round_trip_and_summary_consistency(sa, extra_d):
    s, a = sa
    d = s + 1 + extra_d
    c = AcceptCounts.from_accepted(a, s, d)
    assert AcceptCounts.from_dict(c.to_dict()) == c
    sm = summary(c, (("bonus", bonus_accept_rate),))
    if a:
        assert sm["accept_length"] == pytest.approx(1 + sum(a) / len(a))
        assert sm["accept_length"] - sm["accept_length_no_bonus"] == pytest.approx(1.0)
        assert sm["bonus"] == pytest.approx((sum(a) + len(a)) / (len(a) * d))
        # Σ_i P(a >= i) = mean(a)
        assert sum(sm["acceptance_at_depth"]) == pytest.approx(sm["accept_length_no_bonus"])
        prod = 1.0
        for i, q in enumerate(sm["conditional_acceptance"]):
            prod = prod * q if q is not None else 0.0
            assert prod == pytest.approx(sm["acceptance_at_depth"][i])


@given(accepted_lists, st.lists(st.integers(0, 5), max_size=40))
def test_merge_equals_pooling(sa, b):
    s, a = sa
    b = [min(x, s) for x in b]
    pooled = AcceptCounts.from_accepted(a + b, s, s + 1)
    assert merge(AcceptCounts.from_accepted(a, s, s + 1), AcceptCounts.from_accepted(b, s, s + 1)) == pooled
    if a or b:
        assert not math.isnan(accept_length(pooled))


def test_from_accepted_takes_tensors():
    c = AcceptCounts.from_accepted(torch.tensor([[1, 0], [2, 2]]), 2, 3)
    assert c.accepted_hist == (1, 1, 2)
