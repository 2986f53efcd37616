"""Command-line flags for the prompt side of a run: renderings and long context. They fill
the case's [rendering] and [long_context] sections, for a case built from flags and on top of a
case file alike. Paths given on the command line are taken from the working directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from diag.errors import DiagError


def register(p) -> None:
    p.add_argument("--rendering", action="append", default=[],
                   help="prompt rendering to compare, e.g. raw, chat, chat+nothink, NAME+system (repeat)")
    p.add_argument("--serving-rendering", help="the rendering the server applies (default auto)")
    p.add_argument("--trained-rendering", help="the rendering the drafter was trained with")
    p.add_argument("--template", action="append", default=[], metavar="NAME=PATH",
                   help="a chat template file usable as rendering NAME, e.g. train=train.jinja (repeat)")
    p.add_argument("--system-prompt", help="system prompt text for +system renderings")
    p.add_argument("--long-context", type=int, metavar="TOKENS",
                   help="measure acceptance against position up to TOKENS")
    p.add_argument("--long-context-file", help="text to cut the long-context prompts from (default: the prompt set)")


def _templates(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise DiagError("a template flag needs NAME=PATH", field="--template",
                            expected="e.g. --template train=templates/train.jinja", found=item)
        out[name] = str(Path(path).resolve())
    return out


def apply(case, a):
    """The case with the flags' rendering and long-context settings on top."""
    r, lc = case.rendering, case.long_context
    r = replace(r, renderings=tuple(a.rendering) or r.renderings, serving=a.serving_rendering or r.serving,
                trained=a.trained_rendering or r.trained, system_prompt=a.system_prompt or r.system_prompt,
                templates={**(r.templates or {}), **_templates(a.template)} or None)
    lc = replace(lc, length=a.long_context if a.long_context is not None else lc.length,
                 file=str(Path(a.long_context_file).resolve()) if a.long_context_file else lc.file)
    case = replace(case, rendering=r, long_context=lc)
    from diag.run.case import check_long_context, check_rendering
    check_rendering(case)
    check_long_context(case)
    return case
