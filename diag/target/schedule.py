"""The GPipe schedule of a forward pass through S layer stages in M microbatches: which
(stage, microbatch) steps run together, and how much of the time a stage waits.

A stage is a run of consecutive decoder layers on one device (stages.py finds them in a
placement); microbatch m must leave stage s before it enters stage s + 1, and a stage takes
its microbatches in order. GPipe's forward runs in clock ticks: at tick k every stage s with
0 <= k - s < M works on microbatch k - s, so M + S - 1 ticks do all S * M steps.
Worked example, S = 3 stages, M = 4 microbatches (step = (stage, microbatch)):
  tick 0  (0,0)
  tick 1  (0,1) (1,0)
  tick 2  (0,2) (1,1) (2,0)
  tick 3  (0,3) (1,2) (2,1)
  tick 4        (1,3) (2,2)
  tick 5              (2,3)
6 ticks of S = 3 stage slots: 12 steps busy, 6 idle: bubble fraction (S - 1) / (M + S - 1)
= 2 / 6 = 0.33; run one after another (today's placement) the same work takes S * M = 12
ticks of one stage each, so the pipeline's speedup is S * M / (M + S - 1) = 2.0.

Within a tick, steps are listed by ascending stage: a step that blocks the host (a device
read) then comes after the steps it would otherwise hold back. This module is arithmetic
over step indices; it knows nothing about tensors, devices or models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    stage: int
    microbatch: int


def gpipe_ticks(stages: int, microbatches: int) -> list[list[Step]]:
    """The forward clock ticks (module docstring): tick k holds (s, k - s) for every stage s
    with 0 <= k - s < microbatches, ascending s. S = 2, M = 2 -> [[(0,0)], [(0,1), (1,0)], [(1,1)]]."""
    _check(stages, microbatches)
    return [[Step(s, k - s) for s in range(stages) if 0 <= k - s < microbatches]
            for k in range(microbatches + stages - 1)]


def gpipe_order(stages: int, microbatches: int) -> list[Step]:
    """Every step once, in the order the host issues them: tick by tick."""
    return [step for tick in gpipe_ticks(stages, microbatches) for step in tick]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The share of stage time spent idle: (S - 1) / (M + S - 1). S = 8, M = 5 -> 7 / 12 = 0.583;
    one stage never waits (0.0)."""
    _check(stages, microbatches)
    return (stages - 1) / (microbatches + stages - 1)


def pipelined_seconds(sequential_s: float, stages: int, microbatches: int) -> float:
    """Wall seconds of a pass that takes `sequential_s` with its stages run one after another,
    once the stages overlap: each of the M + S - 1 ticks lasts one stage's share of one
    microbatch, sequential_s / (S * M), when the stages are balanced.
    100 s over S = 8, M = 5 -> 100 * 12 / 40 = 30 s (= 100 / 8 / (1 - 0.583))."""
    _check(stages, microbatches)
    return sequential_s * (microbatches + stages - 1) / (stages * microbatches)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"a pipeline needs >= 1 stage and >= 1 microbatch, got S={stages}, M={microbatches}")
