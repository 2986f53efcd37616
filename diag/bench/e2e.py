"""One `diag run` on a Kimi-shaped INT4 target, end to end, the way a user's first run goes:
a fresh cache (no digest memo, no cached pass), the page cache dropped, then run_case and
the report writer, each phase timed; then the same case again, answered from the pass
cache, which is what every further layout x tree costs.

  first run    target_load_s (cold read, digests primed), target_generate_s (greedy
               continuations), target_capture_s (the teacher-forced pass), drafter_s
               (layouts x trees x modes), summary_s (speedup, regimes, verdicts), report_s
  cached run   no target load, no replay (the evaluations' cache, run/eval_cache.py); checks_s
               is what a repeat run pays before its passes (goal REPEAT_GOALS: <= 2 s)
  one more     the cached case with one more layout over the captured points: the passes and
  layout       every other variant from the caches, only the new layout's trees replayed
               (goal: <= 5 s for the whole run, report included)

Hook for other decodings: `evaluate` overrides any EvaluateSpec field (e.g. the sampled
decoding axis once it exists: {"decodings": [...]}) without changing this module; the CLI
passes `--e2e-evaluate KEY=JSON`. This module knows cases and the pipeline's entry points;
nothing about kernels.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from diag.bench.disk import drop_page_cache
from diag.checkpoint.headers import shard_files

TREES = ("chain-1", "chain-3", "chain-5", "s3-k4-d5", "s3-k4-d8", "s3-k8-d16")
REPEAT_GOALS = {("cached", "checks_s"): 2.0, ("one_more_layout", "wall_s"): 5.0}   # seconds, at most


def _order(point: str) -> int:
    return -1 if point == "embed" else 1 << 20 if point == "final" else int(point[1:])


def one_more_layout(layouts: list[str]) -> str:
    """A layout not in `layouts` over the points they already capture (so the cached passes
    answer it): the first 3 of those points, in order, that is new.
    Example: embed+L2+L4, L1+L2+L4, embed+L1+L4 -> points embed, L1, L2, L4 -> embed+L1+L2."""
    from itertools import combinations

    points = sorted({p for x in layouts for p in x.split("+")}, key=_order)
    return next("+".join(c) for c in combinations(points, 3) if "+".join(c) not in layouts)


def goals(result: dict) -> dict:
    """Each REPEAT_GOALS figure of an end_to_end result: {"cached.checks_s": {"value", "limit", "met"}}."""
    out = {}
    for (run, key), limit in REPEAT_GOALS.items():
        value = result.get(run, {}).get(key)
        out[f"{run}.{key}"] = {"value": value, "limit": limit, "met": value is not None and value <= limit}
    return out


def e2e_layouts(trained: str, layers: int) -> list[str]:
    """The drafter's trained layout and two others that exist at K layers (points embed,
    L1..LK, final; each layout's points strictly increasing).
    K = 4: embed+L2+L4 (trained), L1+L2+L4, embed+L1+L4.
    K = 2: embed+L1+L2 (trained), L1+L2+final, embed+L1+final."""
    mid = max(2, layers // 2)
    second = f"L1+L{mid}+L{layers}" if mid < layers else f"L1+L{layers}+final"
    third = f"embed+L1+L{layers}" if layers > 2 else "embed+L1+final"
    cands = [trained, second, third]
    return list(dict.fromkeys(cands))


def kimi_case(target: Path, drafter: Path, layouts: list[str], *, prompts: Path, limit: int | None,
              max_new_tokens: int, trees=TREES, evaluate: dict | None = None, gpus: int = 1,
              dtype: str = "bfloat16"):
    from diag.run.case import Case, EvaluateSpec, ModelSpec, PlacementSpec, PromptSpec

    ev = EvaluateSpec(layouts=tuple(layouts), trees=tuple(trees), modes=("eagle3",), token_budget=32768)
    ev = replace(ev, **(evaluate or {}))
    return Case(version=1, name="kimi-shaped-e2e", source="<bench>",
                target=ModelSpec(str(target), dtype), drafter=ModelSpec(str(drafter), dtype),
                prompts=PromptSpec(file=str(prompts), max_new_tokens=max_new_tokens, limit=limit),
                evaluate=ev, placement=PlacementSpec(gpus=gpus))


def _one_run(case, out: Path) -> dict:
    from diag.report.writer import write_report
    from diag.run.pipeline import run_case

    t0 = time.perf_counter()
    run = run_case(case, progress=False, use_cache=True)
    t1 = time.perf_counter()
    write_report(run, out, argv=["diag", "bench", "gpu"])
    t2 = time.perf_counter()
    variants = len(run.evaluations)
    tp = run.target_pass
    return {**run.timings, "run_s": t1 - t0, "report_s": t2 - t1, "wall_s": t2 - t0,
            "evaluations": variants, "sequences": tp["sequences"], "tokens": tp["tokens"],
            "evaluations_replayed": run.timings.get("evaluations_replayed"),
            "continuation_tokens": tp["continuation_tokens"],
            "cached": all(r["cached"] for r in tp["regimes"].values()),
            "best_layout": run.best_layout(), "verdicts": len(run.verdicts)}


def end_to_end(target: Path, drafter: Path, trained_layout: str, layers: int, workdir: Path, *,
               prompts: Path, limit: int | None = None, max_new_tokens: int = 512,
               evaluate: dict | None = None, gpus: int = 1, dtype: str = "bfloat16",
               trees=TREES, log=print, whole_machine: bool = True) -> dict:
    """whole_machine=False drops only the target's pages before the first run (a shared machine
    keeps its page cache: the CPU bench, tests)."""
    cache = Path(workdir) / "e2e-cache"
    old = os.environ.get("DIAG_CACHE_DIR")
    os.environ["DIAG_CACHE_DIR"] = str(cache)              # a first run: nothing memoised
    lays = e2e_layouts(trained_layout, layers)
    case = kimi_case(target, drafter, lays, prompts=prompts, limit=limit, max_new_tokens=max_new_tokens,
                     evaluate=evaluate, gpus=gpus, dtype=dtype, trees=trees)
    try:
        dropped = drop_page_cache(shard_files(Path(target)), whole_machine=whole_machine)
        first = _one_run(case, Path(workdir) / "e2e-first")
        log(f"[bench] e2e first run: {first}")
        again = _one_run(case, Path(workdir) / "e2e-cached")
        log(f"[bench] e2e cached run: checks_s {again['checks_s']:.3f} (goal <= 2), drafter_s "
            f"{again['drafter_s']:.3f}, {again['evaluations_replayed']} of {again['evaluations']} replayed, "
            f"wall_s {again['wall_s']:.3f}")
        more_case = replace(case, evaluate=replace(case.evaluate, layouts=(*lays, one_more_layout(lays))))
        more = _one_run(more_case, Path(workdir) / "e2e-one-more-layout")
        log(f"[bench] e2e.one_more_layout: {more['wall_s']:.3f} s in all (goal <= 5), "
            f"{more['evaluations_replayed']} of {more['evaluations']} replayed")
    finally:
        os.environ.pop("DIAG_CACHE_DIR") if old is None else os.environ.update(DIAG_CACHE_DIR=old)
    per_variant = more["drafter_s"] / max(more["evaluations_replayed"] or 0, 1)   # a further layout x tree
    out = {"layers": layers, "layouts": lays, "trees": list(case.evaluate.trees),
            "prompts": first["sequences"], "max_new_tokens": max_new_tokens, "cache_drop": dropped,
            "token_budget": case.evaluate.token_budget,
            "first": first, "cached": again, "cached_seconds_per_variant": per_variant,
            "first_verdict_after_load_s": first["wall_s"] - first.get("target_load_s", 0.0),
            "one_more_layout": {**more, "layout": one_more_layout(lays)}}
    out["repeat_goals"] = goals(out)
    return out
