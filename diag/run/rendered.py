"""A prompt set under every rendering a case names: the token ids each target pass reads.

The serving rendering (what the server applies; the run's reference) comes first, then the
trained one (what the drafter was trained with), then the others the case lists, each once.
Every rendering is checked against the tokenizer and the template files here, so a missing
file, a template without a thinking switch or a +system rendering without a system prompt
fails before any weight is read. This module knows cases, prompts and tokenizers; no models.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.run.case import Case, resolve_path
from diag.run.prompts import PromptSet
from diag.run.render import Renderer, load_template
from diag.run.rendering import Rendering, parse


@dataclass(frozen=True)
class RenderedPrompts:
    serving: str                                   # canonical name, the reference rendering
    trained: str | None                            # what the drafter was trained with, if known
    names: tuple[str, ...]                         # serving first, each once
    ids: dict[str, list[tuple[str, str, list[int]]]]   # name -> (prompt id, category, token ids)
    templates: dict[str, str]                      # template name -> file it was read from

    def others(self) -> tuple[str, ...]:
        return self.names[1:]


def renderer_for(case: Case, tok, tokenizer_file: str) -> Renderer:
    spec = case.rendering
    templates = {}
    for name, path in (spec.templates or {}).items():
        file = resolve_path(path, case, f"rendering.templates.{name}")
        templates[name] = (file, load_template(file, field_name=f"rendering.templates.{name}"))
    return Renderer(tok, templates, spec.system_prompt, tokenizer_file)


def renderings_of(case: Case) -> tuple[Rendering, Rendering | None, list[Rendering]]:
    """(serving, trained or None, every rendering to evaluate, serving first, each once)."""
    spec, names = case.rendering, tuple(case.rendering.templates or {})
    serving = parse(spec.serving, names, field="rendering.serving")
    trained = parse(spec.trained, names, field="rendering.trained") if spec.trained else None
    listed = [parse(r, names, field="rendering.renderings") for r in spec.renderings]
    order = list({r.name: r for r in [serving, *([trained] if trained else []), *listed]}.values())
    return serving, trained, order


def render_prompts(case: Case, tok, pset: PromptSet, tokenizer_file: str) -> RenderedPrompts:
    serving, trained, order = renderings_of(case)
    renderer = renderer_for(case, tok, tokenizer_file)
    for r in order:
        renderer.check(r, field_name="rendering")
    ids = {r.name: [(p.id, p.category, renderer.ids(p, r)) for p in pset.prompts] for r in order}
    return RenderedPrompts(serving.name, trained.name if trained else None, tuple(ids), ids,
                           {k: f for k, (f, _) in renderer.templates.items()})
