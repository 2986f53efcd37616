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
    p.add_argument("--long-context-rungs", type=int, metavar="N",
                   help="long-context prompt lengths between the short prompts and TOKENS (default 8)")
    p.add_argument("--long-context-per-rung", type=int, metavar="N", help="prompts per length (default 2)")


# The case field each flag sets: a check of the case after all overrides names the flag
# when one set the value (diag.cli.run.checked).
FLAG_OF = {"rendering.renderings": "--rendering", "rendering.serving": "--serving-rendering",
           "rendering.trained": "--trained-rendering", "long_context.length": "--long-context",
           "long_context.file": "--long-context-file", "long_context.rungs": "--long-context-rungs",
           "long_context.per_rung": "--long-context-per-rung"}


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
    """The case with the flags' rendering and long-context settings on top (unchecked: the
    case's checks run once, after every override)."""
    r, lc = case.rendering, case.long_context
    r = replace(r, renderings=tuple(a.rendering) or r.renderings, serving=a.serving_rendering or r.serving,
                trained=a.trained_rendering or r.trained, system_prompt=a.system_prompt or r.system_prompt,
                templates={**(r.templates or {}), **_templates(a.template)} or None)
    pick = lambda flag, have: flag if flag is not None else have  # noqa: E731
    lc = replace(lc, length=pick(a.long_context, lc.length), rungs=pick(a.long_context_rungs, lc.rungs),
                 per_rung=pick(a.long_context_per_rung, lc.per_rung),
                 file=str(Path(a.long_context_file).resolve()) if a.long_context_file else lc.file)
    return replace(case, rendering=r, long_context=lc)
