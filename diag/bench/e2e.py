"""One `diag run` on a Kimi-shaped INT4 target, end to end, the way a user's first run goes:
a fresh cache (no digest memo, no cached pass), the page cache dropped, then run_case and
the report writer, each phase timed; then the same case again, answered from the pass
cache, which is what every further layout x tree costs.

  first run    target_load_s (cold read, digests primed), target_generate_s (greedy
               continuations), target_capture_s (the teacher-forced pass), drafter_s
               (layouts x trees x modes), summary_s (speedup, regimes, verdicts), report_s
               (report_phases: envelope, figures and how many were drawn, json, samples,
               markdown, publish); checks_s in parts (checks_prepare_s, checks_drafter_s: read onto
               its device, checks_tables_s)
  cached run   no target load, no replay (the evaluations' cache, run/eval_cache.py); checks_s
               is what a repeat run pays before its passes (goal REPEAT_GOALS: <= 2 s)
  one more     the cached case with one more layout over the captured points: the passes and
  layout       every other variant from the caches, only the new layout's trees replayed
               (goal: <= 5 s for the whole run, report included); the target loaded again,
               as a new `diag run` process loads it
  one more     run first, the same case inside the first run's target/resident.kept() block: on the
  layout kept  target the first run loaded, as `diag run --watch` keeps it (target_kept); the cache
               files it wrote are then removed, so the one-more-layout run decodes the same again

`evaluate` overrides any EvaluateSpec field (the CLI: `--e2e-evaluate KEY=JSON`); `decoding`
any DecodingSpec field, the case's [decoding] (the CLI: `--e2e-decoding KEY=JSON`, or
`--e2e-sampled` for SAMPLED: T 1.0, top-p 0.95, Kimi's served decoding). Greedy is always
evaluated (the teacher-forced replay); each sampled decoding runs the decode loop for the
scope's variants, timed as sampled_s with the tree shapes, lanes and rounds it decoded (run/sampled.py).
With a sampled decoding the result's `sampled` says what the sampled verdict costs:
  first_sampled_s        the first run's decode loop, every sampled variant of the verdicts
  further_variant_s      the one-more-layout run's decode loop: what one further sampled variant
                         (the new layout on the primary tree) costs. The sampled cache answers a
                         variant only beside the lanes it was decoded with, so that loop decodes
                         its tree's other lanes again: further_lanes_decoded says how many
  further_kept_*         the kept run's: its loop and wall on the loaded target, target_kept models taken
  *_seconds_per_round    each run's decode seconds / its rounds (one verify forward of a batch)
  *_accept_length_min    the first run's sampled and greedy evaluations' worst accept length
Worked example: first run sampled_s 60 s over 1,200 rounds (0.05 s a round); one more layout
decodes the chain-1 loop again, 4 layouts x 3 seeds = 12 lanes, 9 s over 180 rounds: further
variant 9 s, 0.05 s a round. This module knows cases and the pipeline's entry points; nothing
about kernels.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from diag.bench.disk import drop_page_cache
from diag.checkpoint.headers import shard_files
from diag.target.resident import kept

TREES = ("chain-1", "chain-3", "chain-5", "s3-k4-d5", "s3-k4-d8", "s3-k8-d16")
SAMPLED = {"temperature": [1.0], "top_p": [0.95]}      # Kimi-K2.5's thinking-mode decoding
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
              dtype: str = "bfloat16", decoding: dict | None = None):
    """decoding: DecodingSpec fields ({"temperature": [1.0], "top_p": [0.95]}); lists become the
    sweep tuples a case file's lists become."""
    from diag.run.case import Case, DecodingSpec, EvaluateSpec, ModelSpec, PlacementSpec, PromptSpec

    ev = EvaluateSpec(layouts=tuple(layouts), trees=tuple(trees), modes=("eagle3",), token_budget=32768)
    ev = replace(ev, **(evaluate or {}))
    dec = replace(DecodingSpec(), **{k: tuple(v) if isinstance(v, list) else v for k, v in (decoding or {}).items()})
    return Case(version=1, name="kimi-shaped-e2e", source="<bench>",
                target=ModelSpec(str(target), dtype), drafter=ModelSpec(str(drafter), dtype),
                prompts=PromptSpec(file=str(prompts), max_new_tokens=max_new_tokens, limit=limit),
                evaluate=ev, placement=PlacementSpec(gpus=gpus), decoding=dec)


def _undone(cache: Path, run):
    """run(), then every file it created under the cache removed: the next run meets the cache
    as it was (the one-more-layout run decodes what the kept run decoded, from the same state)."""
    before = {p for p in cache.rglob("*") if p.is_file()}
    try:
        return run()
    finally:
        for p in {p for p in cache.rglob("*") if p.is_file()} - before:
            p.unlink()


def _one_run(case, out: Path) -> dict:
    from diag.report.writer import write_report
    from diag.run.pipeline import run_case

    t0 = time.perf_counter()
    run = run_case(case, progress=False, use_cache=True)
    t1 = time.perf_counter()
    phases: dict = {}
    write_report(run, out, argv=["diag", "bench", "gpu"], phases=phases)
    t2 = time.perf_counter()
    variants = len(run.evaluations)
    tp = run.target_pass
    accept = {}
    for name, evs in (("greedy", [e for e in run.evaluations if e.decoding == "greedy"]),
                      ("sampled", [e for e in run.evaluations if e.decoding != "greedy"])):
        got = [e.accept_length for e in evs if e.accept_length is not None]
        if got:
            accept[f"{name}_accept_length_min"], accept[f"{name}_accept_length_max"] = min(got), max(got)
    return {**run.timings, **accept, "run_s": t1 - t0, "report_s": t2 - t1, "report_phases": phases, "wall_s": t2 - t0,
            "evaluations": variants, "sequences": tp["sequences"], "tokens": tp["tokens"],
            "evaluations_replayed": run.timings.get("evaluations_replayed"),
            "continuation_tokens": tp["continuation_tokens"],
            "cached": all(r["cached"] for r in tp["regimes"].values()),
            "best_layout": run.best_layout(), "verdicts": len(run.verdicts)}


def end_to_end(target: Path, drafter: Path, trained_layout: str, layers: int, workdir: Path, *,
               prompts: Path, limit: int | None = None, max_new_tokens: int = 512,
               evaluate: dict | None = None, gpus: int = 1, dtype: str = "bfloat16",
               trees=TREES, log=print, whole_machine: bool = True, decoding: dict | None = None,
               drafter_note: str | None = None, partial=None) -> dict:
    """whole_machine=False drops only the target's pages before the first run (a shared machine
    keeps its page cache: the CPU bench, tests). decoding: DecodingSpec fields (SAMPLED);
    drafter_note: how the drafter was made, recorded beside the figures. partial(dict), when
    given, receives what is measured so far after each run, marked "incomplete" (the GPU bench
    saves it: a device call stopped at its time limit keeps the first run's figures)."""
    cache = Path(workdir) / "e2e-cache"
    old = os.environ.get("DIAG_CACHE_DIR")
    os.environ["DIAG_CACHE_DIR"] = str(cache)              # a first run: nothing memoised
    lays = e2e_layouts(trained_layout, layers)
    case = kimi_case(target, drafter, lays, prompts=prompts, limit=limit, max_new_tokens=max_new_tokens,
                     evaluate=evaluate, gpus=gpus, dtype=dtype, trees=trees, decoding=decoding)
    try:
        dropped = drop_page_cache(shard_files(Path(target)), whole_machine=whole_machine)
        head = {"layers": layers, "layouts": lays, "trees": list(case.evaluate.trees),
                "max_new_tokens": max_new_tokens, "cache_drop": dropped, **({"drafter": drafter_note} if drafter_note else {})}
        with kept():                      # what `diag run --watch` keeps loaded between the runs
            first = _one_run(case, Path(workdir) / "e2e-first")
            log(f"[bench] e2e first run: {first}")
            if partial is not None:
                partial({**head, "first": first, "incomplete": "the cached and one-more-layout runs did not finish"})
            again = _one_run(case, Path(workdir) / "e2e-cached")
            if partial is not None:
                partial({**head, "first": first, "cached": again, "incomplete": "the one-more-layout runs did not finish"})
            log(f"[bench] e2e cached run: checks_s {again['checks_s']:.3f} (goal <= 2), drafter_s "
                f"{again['drafter_s']:.3f}, {again['evaluations_replayed']} of {again['evaluations']} replayed, "
                f"wall_s {again['wall_s']:.3f}")
            more_case = replace(case, evaluate=replace(case.evaluate, layouts=(*lays, one_more_layout(lays))))
            kept_run = _undone(cache, lambda: _one_run(more_case, Path(workdir) / "e2e-one-more-layout-kept"))
        log(f"[bench] e2e.one_more_layout_kept (the target kept loaded): {kept_run['wall_s']:.3f} s in all, "
            f"target_kept {kept_run.get('target_kept', 0)}")
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
            "one_more_layout": {**more, "layout": one_more_layout(lays)},
            "one_more_layout_kept": {**kept_run, "layout": one_more_layout(lays)}}
    out["repeat_goals"] = goals(out)
    if drafter_note:
        out["drafter"] = drafter_note
    if "sampled_s" in first:
        out["decoding"] = decoding
        out["sampled"] = sampled_figures(first, more, kept_run)
        log(f"[bench] e2e sampled: {out['sampled']}")
    return out


def _per_round(run: dict) -> float | None:
    rounds = run.get("sampled_rounds", 0)
    return run["sampled_s"] / rounds if rounds else None


def sampled_figures(first: dict, more: dict, kept_run: dict | None = None) -> dict:
    """What the sampled verdict costs (module docstring), from the first and the one-more-layout
    runs' timings: {"first_sampled_s", "further_variant_s", "seconds_per_round", ...}; with the
    kept run's, further_kept_*: the same on the target the first run loaded (`diag run --watch`)."""
    kept_figures = {} if kept_run is None else {
        "further_kept_variant_s": kept_run.get("sampled_s", 0.0), "further_kept_rounds": kept_run.get("sampled_rounds", 0),
        "further_kept_wall_s": kept_run["wall_s"], "further_kept_target_load_s": kept_run.get("target_load_s", 0.0),
        "further_kept_targets": kept_run.get("target_kept", 0)}
    return {**kept_figures, "first_sampled_s": first["sampled_s"], "first_rounds": first.get("sampled_rounds", 0),
            "first_verified_tokens": first.get("sampled_verified_tokens", 0),
            "further_verified_tokens": more.get("sampled_verified_tokens", 0),
            "first_trees_decoded": first.get("sampled_trees_decoded", 0), "first_lanes": first.get("sampled_lanes", 0),
            "first_seconds_per_round": _per_round(first),
            "first_sampled_verdict_after_load_s": first["wall_s"] - first.get("target_load_s", 0.0),
            "further_variant_s": more.get("sampled_s", 0.0), "further_rounds": more.get("sampled_rounds", 0),
            "further_trees_decoded": more.get("sampled_trees_decoded", 0),
            "further_trees_cached": more.get("sampled_trees_cached", 0),
            "further_lanes_decoded": more.get("sampled_lanes", 0),
            "further_seconds_per_round": _per_round(more) if "sampled_s" in more else None,
            "sampled_accept_length_min": first.get("sampled_accept_length_min"),
            "greedy_accept_length_min": first.get("greedy_accept_length_min")}
