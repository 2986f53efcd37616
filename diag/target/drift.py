"""How far hidden states moved between two regimes, per capture point.

For one point with reference states R [T, H] and other states O [T, H]:
  cosine_mean  mean over tokens t of cos(R[t], O[t])
               (two zero rows count as 1.0, one zero row as 0.0)
  relative_l2  ||O - R||_F / ||R||_F over all tokens
Worked example: R = [[1, 0], [0, 2]], O = [[1, 1], [0, 2]] ->
  cos = [1/sqrt(2), 1] -> cosine_mean 0.8536; ||O-R|| = 1, ||R|| = sqrt(5)
  -> relative_l2 0.4472.
Computed in float64 whatever the states' dtype.

This module knows tensors only: no models, no capture, no files.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple

import torch

from diag.errors import DiagError


class Drift(NamedTuple):
    cosine_mean: float
    relative_l2: float


def row_cosine(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Cosine per token, [T, H] x [T, H] -> [T] (float64)."""
    r, o = ref.double(), other.double()
    rn, on = r.norm(dim=-1), o.norm(dim=-1)  # [T]
    cos = (r * o).sum(dim=-1) / (rn * on).clamp_min(torch.finfo(torch.float64).tiny)
    both_zero = (rn == 0) & (on == 0)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def relative_l2(ref: torch.Tensor, other: torch.Tensor) -> float:
    """||other - ref|| / ||ref|| (0 if both are zero, inf if only ref is)."""
    diff = (other.double() - ref.double()).norm().item()
    base = ref.double().norm().item()
    if base == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / base


def point_drift(ref: torch.Tensor, other: torch.Tensor, *, point: Hashable = None) -> Drift:
    """Drift of one capture point's states, [T, H] x [T, H]."""
    if ref.shape != other.shape:
        raise DiagError("captured states of two regimes differ in shape", field=str(point),
                        expected=list(ref.shape), found=list(other.shape))
    if ref.numel() == 0:
        raise DiagError("no captured tokens to compare", field=str(point),
                        expected="at least one token", found=list(ref.shape))
    return Drift(row_cosine(ref, other).mean().item(), relative_l2(ref, other))


def drift(ref: dict, other: dict) -> dict:
    """Per capture point (keys of `ref`, in its order) -> Drift."""
    missing = [k for k in ref if k not in other]
    if missing:
        raise DiagError("a capture point is missing from the compared regime",
                        field=", ".join(map(str, missing)), expected=[str(k) for k in ref],
                        found=[str(k) for k in other])
    return {k: point_drift(ref[k], other[k], point=k) for k in ref}
