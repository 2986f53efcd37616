"""Command-line flags for the prompt side of a run: renderings, and each registered
diagnosis's own (diag/diagnoses/: Diagnosis.add_flags, apply_flags, flag_of). They fill the
case's [rendering] section and the diagnoses' sections, for a case built from flags and on top
of a case file alike. Paths given on the command line are taken from the working directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from diag.diagnoses import DIAGNOSES
from diag.errors import DiagError


def register(p) -> None:
    p.add_argument("--rendering", action="append", default=[],
                   help="prompt rendering to compare, e.g. raw, chat, chat+nothink, NAME+system (repeat)")
    p.add_argument("--serving-rendering", help="the rendering the server applies (default auto)")
    p.add_argument("--trained-rendering", help="the rendering the drafter was trained with")
    p.add_argument("--template", action="append", default=[], metavar="NAME=PATH",
                   help="a chat template file usable as rendering NAME, e.g. train=train.jinja (repeat)")
    p.add_argument("--system-prompt", help="system prompt text for +system renderings")
    for d in DIAGNOSES:
        d.add_flags(p)


# The case field each flag sets: a check of the case after all overrides names the flag
# when one set the value (diag.cli.run.checked).
FLAG_OF = {"rendering.renderings": "--rendering", "rendering.serving": "--serving-rendering",
           "rendering.trained": "--trained-rendering", **{k: v for d in DIAGNOSES for k, v in d.flag_of.items()}}


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
    """The case with the flags' rendering and diagnoses' settings on top (unchecked: the
    case's checks run once, after every override)."""
    r = case.rendering
    r = replace(r, renderings=tuple(a.rendering) or r.renderings, serving=a.serving_rendering or r.serving,
                trained=a.trained_rendering or r.trained, system_prompt=a.system_prompt or r.system_prompt,
                templates={**(r.templates or {}), **_templates(a.template)} or None)
    case = replace(case, rendering=r)
    for d in DIAGNOSES:
        case = d.apply_flags(case, a)
    return case
