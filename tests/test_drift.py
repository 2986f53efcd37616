"""drift(): cosine mean and relative L2 per capture point."""

import math

import pytest
import torch

from diag.target.drift import Drift, drift, point_drift, row_cosine
from diag.errors import DiagError


def test_worked_example():
    ref = {"L3": torch.tensor([[1.0, 0.0], [0.0, 2.0]])}
    other = {"L3": torch.tensor([[1.0, 1.0], [0.0, 2.0]])}
    d = drift(ref, other)["L3"]
    assert d.cosine_mean == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert d.relative_l2 == pytest.approx(1 / math.sqrt(5))


def test_identity_opposite_and_scaling():
    x = torch.randn(5, 8)
    assert point_drift(x, x) == Drift(pytest.approx(1.0), 0.0)
    assert point_drift(x, -x).cosine_mean == pytest.approx(-1.0)
    assert point_drift(x, -x).relative_l2 == pytest.approx(2.0)
    scaled = point_drift(x, 3 * x)
    assert scaled.cosine_mean == pytest.approx(1.0) and scaled.relative_l2 == pytest.approx(2.0)


def test_zero_rows_and_dtypes():
    ref = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.bfloat16)
    assert row_cosine(ref, ref).tolist() == [1.0, 1.0]
    assert row_cosine(ref, torch.tensor([[1.0, 0.0], [1.0, 0.0]])).tolist() == [0.0, 1.0]
    assert point_drift(torch.zeros(2, 2), torch.ones(2, 2)).relative_l2 == float("inf")


def test_keeps_point_order_and_fails_clearly():
    ref = {"final": torch.ones(2, 4), "embed": torch.ones(2, 4)}
    assert list(drift(ref, dict(reversed(list(ref.items()))))) == ["final", "embed"]
    with pytest.raises(DiagError, match="missing"):
        drift(ref, {"final": torch.ones(2, 4)})
    with pytest.raises(DiagError, match="differ in shape"):
        drift({"L1": torch.ones(2, 4)}, {"L1": torch.ones(3, 4)})
