"""The speedup model: golden numbers, interpolation of verify cost, break-even."""

import pytest
from hypothesis import given, strategies as st

from diag.errors import DiagError
from diag.diagnoses.pricing.model import (StepCosts, break_even_accept_length, round_cost, speedup, summary,
                          tokens_per_second, verify_cost)
from diag.trees import TreeShape

MS = 1e-3


def test_golden_docstring_example():
    costs = StepCosts(t_decode=11.1 * MS, t_draft=3 * MS, t_verify={4: 13 * MS})
    chain3 = TreeShape(3, 1, 4)
    assert round_cost(chain3, costs) == pytest.approx(22 * MS)
    assert break_even_accept_length(chain3, costs) == pytest.approx(22 / 11.1)
    assert speedup(2.0, chain3, costs) == pytest.approx(2 * 11.1 / 22)
    assert speedup(1.8, chain3, costs) < 1.0
    assert tokens_per_second(2.0, chain3, costs) == pytest.approx(2 / 0.022)


def test_story_82_vs_90_tokens_per_second():
    # plain decode 90 tok/s; spec at accept length 2 runs 82 tok/s -> round cost 2/82 s
    costs = StepCosts(t_decode=1 / 90, t_draft=2 * MS, t_verify={6: 2 / 82 - 5 * 2 * MS})
    shape = TreeShape(5, 1, 6)
    assert tokens_per_second(2.0, shape, costs) == pytest.approx(82)
    assert break_even_accept_length(shape, costs) == pytest.approx(2 * 90 / 82)


def test_verify_cost_interpolation():
    costs = StepCosts(1.0, 0.0, {2: 10.0, 8: 16.0})
    assert verify_cost(costs, 2) == 10.0
    assert verify_cost(costs, 4) == pytest.approx(12.0)
    assert verify_cost(costs, 10) == pytest.approx(18.0)
    assert verify_cost(costs, 1) == 10.0
    assert verify_cost(StepCosts(1.0, 0.0, {4: 7.0}), 16) == 7.0
    assert verify_cost(StepCosts(1.0, 0.0, {2: 10.0, 4: 9.0}), 8) == 9.0  # never below last


def test_draft_extend_and_summary():
    costs = StepCosts(10 * MS, 2 * MS, {8: 20 * MS}, t_draft_extend=4 * MS)
    s = summary(2.5, TreeShape(5, 4, 8), costs)
    assert s["round_cost_s"] == pytest.approx(34 * MS)
    assert s["break_even_accept_length"] == pytest.approx(3.4)
    assert s["break_even_reachable"] and s["speedup"] < 1
    assert s["max_speedup"] == pytest.approx(6 * 10 / 34)
    assert StepCosts.from_dict(costs.to_dict()) == costs


def test_bad_costs():
    with pytest.raises(DiagError):
        StepCosts(1.0, 0.1, {})
    with pytest.raises(DiagError):
        StepCosts(0.0, 0.1, {2: 1.0})
    with pytest.raises(DiagError):
        StepCosts.from_dict({"t_decode": 1.0})


@given(st.floats(1e-3, 1.0), st.floats(0, 1.0), st.floats(1e-3, 1.0), st.integers(1, 6),
       st.floats(1.0, 7.0))
def test_break_even_is_where_speedup_is_one(t_dec, t_draft, t_ver, s, accept):
    shape, costs = TreeShape(s, 1, s + 1), StepCosts(t_dec, t_draft, {s + 1: t_ver})
    be = break_even_accept_length(shape, costs)
    assert speedup(be, shape, costs) == pytest.approx(1.0)
    assert (speedup(accept, shape, costs) > 1.0) == (accept > be) or accept == pytest.approx(be)
