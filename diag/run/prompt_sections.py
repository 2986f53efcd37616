"""The prompt-side sections of a run: what differs between training and serving on the side
of the prompts rather than the hidden states.

    renderings     acceptance per prompt rendering, where the renders part   rendering_section.py
    coverage       continuation tokens outside the drafter's hot vocabulary  coverage.py
    loops          accept length with and without rounds inside cycles      loops.py
    long_context   acceptance against position, up to the case's length     long_context.py

Each is read at the run's reference axes on the trained layout (the best eagle3 candidate)
and the primary tree, and is None when it has nothing to say (one rendering; no long-context
length; no trained layout). This module connects the pieces; it knows nothing about files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.replay.evaluation import one, summarize
from diag.replay.replay import Variant, replay
from diag.replay.round_accounting import accounting_for
from diag.run.coverage import coverage_section
from diag.run.inputs import round_accounting
from diag.run.long_context import long_context_section
from diag.run.loops import loop_section
from diag.run.rendering_section import rendering_section
from diag.run.target_passes import LONG_CONTEXT


@dataclass(frozen=True)
class PromptSections:
    renderings: dict | None
    coverage: dict | None
    loops: dict | None
    long_context: dict | None


def _long_context(inp, drafter, embed, head, tp, layout: str, *, progress: bool) -> dict:
    ev, ref, shape = inp.case.evaluate, inp.regimes[0], inp.shapes[0]
    layouts = {c.label: c.layout for c in inp.candidates}
    res = replay(drafter, embed, head, {ref: tp}, [Variant(layout, "eagle3", shape, ref, ref, "raw")], layouts,
                 token_budget=ev.token_budget, progress=progress)
    e = summarize(res[0], buckets=(), seed=ev.seed, n_boot=ev.bootstrap)
    return long_context_section(e, length=inp.case.long_context.length, source=inp.long_source,
                                seed=ev.seed, n_boot=ev.bootstrap)


def prompt_sections(inp, reference, layout: str | None, evals, passes, extra, drafter, embed, head, *,
                    progress: bool) -> PromptSections:
    """`reference`: the run's reference axes; `layout`: the trained (best) layout."""
    if layout is None:
        return PromptSections(None, None, None, None)
    ev = inp.case.evaluate
    decode = inp.tokenizer.decode
    served = one(evals, reference, layout=layout)
    tp = passes[inp.regimes[0]]
    renderings = rendering_section(inp.rendered, evals, reference, layout, decode, seed=ev.seed, n_boot=ev.bootstrap)
    coverage = loops = None
    if served is not None and served.mode == "eagle3":
        coverage = coverage_section(tp, drafter.t2d, served, decode, max_steps=max(s.num_steps for s in inp.shapes),
                                    seed=ev.seed, n_boot=ev.bootstrap,
                                    accounting=accounting_for(round_accounting(inp.case)))
        loops = loop_section(tp.sequences, served, decode, seed=ev.seed, n_boot=ev.bootstrap)
    long_ctx = None
    if LONG_CONTEXT in extra:
        long_ctx = _long_context(inp, drafter, embed, head, extra[LONG_CONTEXT], layout, progress=progress)
    return PromptSections(renderings, coverage, loops, long_ctx)
