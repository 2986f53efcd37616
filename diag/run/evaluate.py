"""Which variants a run evaluates, its reference point on every axis, and the replay that turns
them into Evaluation records.

Variants: every candidate layout x tree shape x regime (features and verifying tokens from
the same regime) under the serving rendering, plus the cross matrix (features from regime A,
tokens from regime B != A) for the trained layout on the primary tree when the case asks for
it, plus every candidate on the primary tree at the reference regime under each other
rendering (its own target pass: other token ids, other continuations).
Reference axes: mode eagle3, the primary tree (the case's first), the reference regime for
features and tokens, the serving rendering; layout ANY. Every ranking and lookup selects
inside it.

This module connects replay and evaluation; it knows nothing about files or reports.
"""

from __future__ import annotations

from diag.replay.evaluation import ANY, LEGACY_AXES, Axes, Evaluation, best, lead, select, summarize
from diag.replay.replay import Variant, replay
from diag.replay.round_accounting import accounting_for
from diag.run.candidates import read_by_config
from diag.run.inputs import Inputs, draft_tables_by_mode, round_accounting
from diag.trees import TreeShape


def serving_rendering(inp: Inputs) -> str:
    return inp.rendered.serving if inp.rendered else LEGACY_AXES["rendering"]


def reference_axes(inp: Inputs) -> Axes:
    """The reference of every axis; decoding = what the server runs (run/decodings.py)."""
    ref = inp.case.evaluate.reference_regime
    served = inp.decoding.served.name if inp.decoding is not None else "greedy"
    return Axes(layout=ANY, mode="eagle3", tree=inp.shapes[0].name, regime=ref, tokens_regime=ref,
                rendering=serving_rendering(inp), decoding=served)


def variants(inp: Inputs) -> list[Variant]:
    return [Variant(c.label, c.mode, shape, reg, reg, serving_rendering(inp))
            for c in inp.candidates for shape in inp.shapes for reg in inp.regimes]


def rendering_variants(inp: Inputs, rendering: str) -> list[Variant]:
    """Every candidate on the primary tree at the reference regime, under `rendering`."""
    ref = inp.regimes[0]
    return [Variant(c.label, c.mode, inp.shapes[0], ref, ref, rendering) for c in inp.candidates]


def cross_variants(inp: Inputs, layout_label: str | None, shape: TreeShape) -> list[Variant]:
    regimes = inp.regimes
    if not inp.case.evaluate.cross_regimes or layout_label is None or len(regimes) < 2:
        return []
    return [Variant(layout_label, "eagle3", shape, a, b, serving_rendering(inp))
            for a in regimes for b in regimes if a != b]


def _summaries(results, inp: Inputs) -> list[Evaluation]:
    ev = inp.case.evaluate
    return [summarize(r, buckets=ev.position_buckets, seed=ev.seed, n_boot=ev.bootstrap) for r in results]


def trained_lead(evaluations, where: Axes | None, case, candidates) -> Evaluation | None:
    """The evaluation a run names as its best layout at `where` (replay/evaluation.lead: under a
    sampled decoding, a tie broken by the drafter's config, then by the case's candidates' order,
    never by a batch's noise), with the case's bootstrap; `case`, `candidates`: a run's or an
    Inputs'. The sampled trees, the layout verdicts and the diagnoses all read this one."""
    return lead(select(evaluations, where), seed=case.evaluate.seed, n_boot=case.evaluate.bootstrap,
                prefer=read_by_config(candidates))


def cached_replay(cache, ids: dict[str, str], *args, **kw):
    """replay(), through the evaluation cache (run/eval_cache.py) when the run has one;
    `ids`: regime -> the digest of the pass the variants read."""
    return cache.replay(ids, *args, **kw) if cache is not None else replay(*args, **kw)


def evaluate(inp: Inputs, drafter, embed, head, passes, *, progress: bool,
             extra: dict | None = None, cache=None) -> list[Evaluation]:
    """Replay every variant, then the cross matrix of the best layout, then the other
    renderings (`extra`: name -> TargetPass at the reference regime). `cache`: an
    eval_cache.EvalCache, whose entries answer every variant replayed before."""
    layouts = {c.label: c.layout for c in inp.candidates}
    budget = inp.case.evaluate.token_budget
    tables = draft_tables_by_mode(inp)
    acc = accounting_for(round_accounting(inp.case))
    ids = cache.regime_passes if cache is not None else {}
    evals = _summaries(cached_replay(cache, ids, drafter, embed, head, passes, variants(inp), layouts,
                                     token_budget=budget, progress=progress, tables=tables, accounting=acc), inp)
    top = best(select(evals, reference_axes(inp), decoding="greedy"))
    cross = cross_variants(inp, top.layout if top else None, inp.shapes[0])
    if cross:
        evals += _summaries(cached_replay(cache, ids, drafter, embed, head, passes, cross, layouts,
                                          token_budget=budget, progress=progress, tables=tables, accounting=acc), inp)
    for name in (inp.rendered.others() if inp.rendered else ()):
        ref = {inp.regimes[0]: cache.extra_passes[name]} if cache is not None else {}
        evals += _summaries(cached_replay(cache, ref, drafter, embed, head, {inp.regimes[0]: extra[name]},
                                          rendering_variants(inp, name), layouts, token_budget=budget,
                                          progress=progress, tables=tables, accounting=acc), inp)
    return evals
