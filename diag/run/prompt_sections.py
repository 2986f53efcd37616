"""The prompt-side sections of a run that are not yet diagnoses of their own (diag/diagnoses/
holds coverage, loops, long context and near ties): what differs between training and serving
on the side of the prompts rather than the hidden states.

    renderings     acceptance per prompt rendering, where the renders part   rendering_section.py

Read at the run's reference axes on the trained layout (the best eagle3 candidate) and the
primary tree; None when it has nothing to say (one rendering; no trained layout). This module
connects the pieces; it knows nothing about files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.run.rendering_section import rendering_section


@dataclass(frozen=True)
class PromptSections:
    renderings: dict | None


def prompt_sections(inp, reference, layout: str | None, evals) -> PromptSections:
    """`reference`: the run's reference axes; `layout`: the trained (best) layout."""
    if layout is None:
        return PromptSections(None)
    ev = inp.case.evaluate
    return PromptSections(rendering_section(inp.rendered, evals, reference, layout, inp.tokenizer.decode,
                                            seed=ev.seed, n_boot=ev.bootstrap))
