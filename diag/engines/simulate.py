"""Settings that make a server benchmark run at a chosen acceptance, so its tokens/s can be
measured at diag's predicted accept length before the drafter is fixed or retrained: every
registered engine's, side by side (EngineRules.simulated_acceptance gives each family's).

The accept length exported is clamped to [1, S + 1] and rounded to 2 decimals, once for all
engines; each engine turns it (and the per-depth acceptance P(a >= i), i = 1..S) into its own
environment variables or config keys. Worked example: L = 2.4712 on s3-k4-d8 -> 2.47, what the
SGLang environment exports; P(a >= i) = (0.8, 0.45, 0.5) -> the non-increasing rates
(0.8, 0.45, 0.45) the vLLM speculative config takes.

This module knows the clamp and the merge; every key and variable is an engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines import families, family_rules
from diag.engines.common import BenchmarkSettings
from diag.engines.protocol import Release
from diag.trees import TreeShape


@dataclass(frozen=True)
class SimulatedAcceptance:
    accept_length: float                          # the value exported, clamped to [1, S+1]
    settings: tuple[BenchmarkSettings, ...]       # one per registered family, registry order

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(n for s in self.settings for n in s.notes)

    def to_json(self) -> dict:
        """{"accept_length": 2.47, <each engine's fields, registry order>, "notes": [...]}."""
        out: dict = {"accept_length": self.accept_length}
        for s in self.settings:
            out.update(s.fields)
        return {**out, "notes": list(self.notes)}


def simulated_acceptance(accept_length: float, acceptance_at_depth: tuple[float, ...], shape: TreeShape,
                         served: Release) -> SimulatedAcceptance:
    """Every engine's settings for a benchmark at this acceptance on this shape; `served` is the
    release whose server was observed (the family that matches it words notes for that release)."""
    value = round(min(max(accept_length, 1.0), shape.num_steps + 1.0), 2)
    return SimulatedAcceptance(value, tuple(
        family_rules(f).simulated_acceptance(value, acceptance_at_depth, shape,
                                             release=served if served.family == f else None)
        for f in families()))
