"""Drafter-side benchmark: diag's batched replay (every position, the depth loop the only
Python loop) over layouts x tree shapes, timed, with its FLOPs counted by torch's
FlopCounterMode on a separate, untimed run (matmuls and attention; elementwise work is
not counted, so the fraction of peak is a lower bound).

This module knows the replay entry point and timing; nothing about files or reports.
"""

from __future__ import annotations

from torch.utils.flop_counter import FlopCounterMode

from diag.bench.common import timed
from diag.layouts import layout
from diag.replay.replay import Variant, replay
from diag.target.passes import TargetPass
from diag.trees import tree_shape

TREES = ("chain-1", "chain-3", "chain-5", "s3-k4-d5", "s3-k4-d8", "s3-k8-d16")


def variants(layouts: list[str], trees=TREES) -> list[Variant]:
    return [Variant(lay, "eagle3", tree_shape(t)) for lay in layouts for t in trees]


def replay_bench(drafter, embed, head, tp: TargetPass, layouts: list[str], peak: float, *,
                 token_budget: int, trees=TREES) -> dict:
    vs = variants(layouts, trees)
    lays = {name: layout(name) for name in layouts}
    passes = {"as-loaded": tp}
    run = lambda: replay(drafter, embed, head, passes, vs, lays, token_budget=token_budget,  # noqa: E731
                         progress=False)
    with FlopCounterMode(display=False) as counter:
        results = run()
    flops = counter.get_total_flops()
    seconds = timed(run, repeat=2, warmup=0)
    rounds = sum(int(sum(len(a) for a in r.accepted)) for r in results)
    positions = rounds // max(len(vs), 1)
    return {"layouts": layouts, "trees": list(trees), "variants": len(vs), "seconds": seconds,
            "rounds": rounds, "positions_per_variant": positions, "rounds_per_second": rounds / seconds,
            "counted_flops": flops, "fraction_of_peak": flops / seconds / peak,
            "tokens_per_second": sum(len(s.ids) for s in tp.sequences) * len(vs) / seconds}
