"""Which share of a pass each rank computes, and the shares put back together: the same batches
one process runs, so every number comes out bit for bit as one process computes it.

The cut is the batch, not the prompt. A captured state depends on the batch it was computed in
(padding to the batch's longest sequence changes the kernels' reduction order in the last
bits), so a rank takes whole batches of the single-process plan:
  generation   the prompts in chunks of the generation batch B (greedy_continuations' chunks),
               a contiguous share of the chunks per rank;
  capture      budget_batches over every sequence (known to every rank after the generation),
               a contiguous share of the groups per rank; run_capture over a share's
               sequences regroups them exactly so (the groups are runs of the same
               longest-first order, and the greedy grouping restarts at each run's head).
Worked example: 5 prompts, B 2 -> chunks [0, 1] [2, 3] [4]; 2 ranks -> rank 0 prompts 0-3,
rank 1 prompt 4. Capture groups [[1, 3], [0, 2], [4]] -> rank 0 sequences 0-3, rank 1 4.
More ranks than chunks or groups leaves a rank idle for that step (empty share), never wrong.

This module knows batches and TargetPass; nothing about processes or sockets (ranks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.errors import DiagError
from diag.run.inputs import Inputs
from diag.target.passes import TargetPass, budget_batches


@dataclass(frozen=True)
class World:
    rank: int
    size: int

    def shard(self, n: int) -> range:
        """This rank's contiguous slice of n items, the first n % size ranks one longer.
        Example: n 5, size 2 -> rank 0 range(0, 3), rank 1 range(3, 5)."""
        base, extra = divmod(n, self.size)
        lo = self.rank * base + min(self.rank, extra)
        return range(lo, lo + base + (1 if self.rank < extra else 0))


def check_world(inp: Inputs, world: World, flag: str) -> None:
    """More ranks than prompts is the user's mistake: a rank would never have work."""
    n = len(inp.prompts)
    if world.size > n:
        raise DiagError("more ranks than prompts: a rank would have nothing to pass", file=inp.case.source,
                        field=flag, expected=f"at most {n} (the case's prompt count after [prompts] limit/filters)",
                        found=world.size, hint=f"use {n} ranks or fewer, or more prompts")


def generation_share(n: int, batch: int, world: World) -> range:
    """The prompts this rank generates: its chunks of `batch` prompts, as one process chunks them.
    Example: n 5, batch 2, 2 ranks -> rank 0 range(0, 4), rank 1 range(4, 5)."""
    chunks = world.shard(-(-n // batch))
    return range(min(chunks.start * batch, n), min(chunks.stop * batch, n))


def capture_share(lengths: list[int], token_budget: int, world: World) -> list[int]:
    """The sequences this rank captures, ascending: its groups of the single-process plan.
    Example: lengths [5, 9, 3, 8, 2], budget 18 -> groups [[1, 3], [0, 2], [4]] -> rank 0 of 2
    [0, 1, 2, 3], rank 1 [4]."""
    groups = budget_batches(lengths, token_budget)
    return sorted(i for g in world.shard(len(groups)) for i in groups[g])


def assemble(regime: str, sequences: list, shares: list[tuple[list[int], dict, list]]) -> TargetPass:
    """Every rank's (indices, states, argmax) -> the pass over every sequence, in order."""
    n = len(sequences)
    argmax: list[torch.Tensor | None] = [None] * n
    states: dict[str, list] = {}
    for idx, st, am in shares:
        for name, rows in st.items():
            got = states.setdefault(name, [None] * n)
            for i, t in zip(idx, rows):
                got[i] = t
        for i, t in zip(idx, am):
            argmax[i] = t
    missing = [i for i, a in enumerate(argmax) if a is None]
    if missing:                         # a share lost on the way is a bug, never a silent hole
        raise RuntimeError(f"sequences {missing[:5]} came back from no rank")
    return TargetPass(regime, sequences, states, argmax)
