"""Prompt renderings compared: acceptance per rendering of the same prompts, and where each
rendering's token ids part from the serving one; the section (report key `renderings`), its
verdict and its Markdown.

The renderings themselves are an axis of the run (the case's [rendering] section: the prompts
under each rendering, run/rendered.py, and a target pass and evaluations per rendering); this
diagnosis only compares them. Per rendering (serving first), on the trained layout (the best
eagle3 candidate at the reference axes, greedy) and the primary tree: the trajectory accept
length with its interval, the paired difference to the serving rendering (the same prompts
resampled in both arms), and the first tokens where its render and the serving render differ,
decoded. The "trained" row is the rendering the drafter was trained with, when the case says so.

Worked example: serving chat+think 2.10, trained chat+nothink 3.05 -> the trained row's
vs_serving is +0.95 [CI]; its first difference is at the generation prompt, serving
"<think>" vs trained "<think></think>". Index arithmetic of the first difference: serving ids
[0, 4, 9, 17, 5, 30] and trained ids [0, 4, 9, 17, 5, 12, 41] share the first 5 ids, so they
part at index 5; `context` is the CONTEXT shared ids before it (decoded), `serving` and `other`
the next WIDTH ids of each. A rendering that only appends (ids [0, 4] vs [0, 4, 7]) parts at
index 2, where the shorter one has nothing left (decoded as "").

Verdict: with a trained rendering named in the case and different from the serving one, a
warning when the paired 95% interval of (serving - trained) lies below zero, ok when it reaches
zero; ok when the two are the same rendering. Without one, an info line listing every
rendering. Nothing when the case renders its prompts one way or nothing was trained.
This module knows Evaluation records, token ids and a decode function; no models, no files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from diag.diagnoses.protocol import Context, Diagnosis
from diag.diagnoses.typed import CI95, COUNT, TREE, meta, to_json
from diag.replay.evaluation import Axes, one
from diag.report.sections.cells import ci, difference as difference_cell, f
from diag.report.views import quoted
from diag.run.verdicts.record import Verdict, fmt
from diag.stats import paired_bootstrap_diff

CONTEXT = 4        # shared tokens shown before the difference
WIDTH = 12         # tokens shown from the difference on
NAME = {"pattern": "^[a-z0-9][a-z0-9_-]*(\\+(think|nothink|system|nosystem))*$"}   # run/rendering.py's grammar


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Parting:
    """Where one prompt's two renders part."""
    prompt: str
    index: int = meta(schema=COUNT)
    context: str = meta()                 # the shared tokens before it, decoded
    serving: str = meta()                 # the serving render from there on, decoded
    other: str = meta()                   # this rendering's
    serving_tokens: int = meta(schema=COUNT)
    other_tokens: int = meta(schema=COUNT)


@dataclass(frozen=True)
class MostCommon:
    serving: str
    other: str
    prompts: int = meta(schema=COUNT)


@dataclass(frozen=True)
class Differs:
    """A rendering against the serving one over the prompt set."""
    prompts: int = meta(schema=COUNT)
    identical: int = meta(schema=COUNT)
    most_common: MostCommon | None = meta()
    examples: tuple[Parting, ...] = meta()


@dataclass(frozen=True)
class Difference:
    difference: float
    ci95: tuple[float | None, float | None] = meta(schema=CI95)


@dataclass(frozen=True)
class Row:
    rendering: str = meta(schema=NAME)
    roles: tuple[str, ...] = meta(schema={"items": {"enum": ["serving", "trained"]}})
    accept_length: float | None = meta(schema={"minimum": 1})
    ci95: tuple[float | None, float | None] = meta(schema=CI95)
    vs_serving: Difference | None = meta()          # paired; None for the serving row
    differs_from_serving: Differs | None = meta()   # None for the serving row


@dataclass(frozen=True)
class RenderingsSection:
    serving: str = meta(schema=NAME)
    trained: str | None = meta(schema=NAME)
    layout: str = meta()
    tree: str = meta(schema=TREE)
    templates: dict[str, str] = meta()              # template name -> the file it was read from
    rows: tuple[Row, ...] = meta(schema={"minItems": 2})

    def row(self, name: str | None) -> Row | None:
        return next((r for r in self.rows if r.rendering == name), None) if name else None


# ---- where two renders part -----------------------------------------------------------------

def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (the shorter length when one is a
    prefix of the other), None when they are equal. [1, 2, 3] vs [1, 5] -> 1."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def parting(pid: str, serving: list[int], other: list[int], decode: Callable[[list[int]], str]) -> Parting | None:
    k = first_difference(serving, other)
    if k is None:
        return None
    return Parting(pid, k, decode(serving[max(0, k - CONTEXT):k]), decode(serving[k:k + WIDTH]),
                   decode(other[k:k + WIDTH]), len(serving), len(other))


def differences(serving: list[tuple[str, str, list[int]]], other: list[tuple[str, str, list[int]]],
                decode: Callable[[list[int]], str], *, examples: int = 3) -> Differs:
    """Over a prompt set under two renderings (same prompts, same order): how many prompts
    render identically, the most common way they part, and the first `examples` partings."""
    rows = [d for (pid, _, a), (_, _, b) in zip(serving, other) if (d := parting(pid, a, b, decode))]
    common = Counter((d.serving, d.other) for d in rows).most_common(1)
    return Differs(len(serving), len(serving) - len(rows),
                   None if not common else MostCommon(common[0][0][0], common[0][0][1], common[0][1]),
                   tuple(rows[:examples]))


# ---- the computation ------------------------------------------------------------------------

def _row(name: str, roles: list[str], e, base, diff: Differs | None, *, seed: int, n_boot: int) -> Row:
    if e is None or e.accept_length is None:
        return Row(name, tuple(roles), None, (None, None), None, diff)
    vs = None
    if base is not None and e is not base and base.accept_length is not None:
        d, lo, hi = paired_bootstrap_diff(e.trajectory_rounds, base.trajectory_rounds, seed=seed, n=n_boot)
        vs = Difference(d, (lo, hi))
    return Row(name, tuple(roles), e.accept_length, tuple(e.accept_length_ci95), vs, diff)


def rendering_section(rendered, evals, where: Axes, layout: str | None, decode, *,
                      seed: int, n_boot: int) -> RenderingsSection | None:
    """`rendered`: run/rendered.RenderedPrompts; `where`: the run's reference axes (serving rendering)."""
    if rendered is None or len(rendered.names) < 2 or layout is None:
        return None
    at = where.but(layout=layout)
    base = one(evals, at)
    serving_ids = rendered.ids[rendered.serving]
    rows = []
    for name in rendered.names:
        roles = (["serving"] if name == rendered.serving else []) + (["trained"] if name == rendered.trained else [])
        diff = None if name == rendered.serving else differences(serving_ids, rendered.ids[name], decode)
        rows.append(_row(name, roles, one(evals, at, rendering=name), base, diff, seed=seed, n_boot=n_boot))
    return RenderingsSection(rendered.serving, rendered.trained, layout, where.tree, dict(rendered.templates),
                             tuple(rows))


# ---- the diagnosis --------------------------------------------------------------------------

def _where(row: Row) -> str:
    d = row.differs_from_serving
    if not d or not d.examples:
        return "the two render every prompt to the same tokens"
    ex = d.examples[0]
    side = lambda text: repr(text) if text else "nothing more"
    return (f"the renders first differ at token {ex.index} of prompt {ex.prompt}: after "
            f"{ex.context!r} the server has {side(ex.serving)}, the training render {side(ex.other)} "
            f"({d.prompts - d.identical} of {d.prompts} prompts differ)")


class PromptRenderings(Diagnosis):
    name = "prompt_renderings"
    key = "renderings"
    Section = RenderingsSection

    def compute(self, ctx: Context) -> RenderingsSection | None:
        ev = ctx.inp.case.evaluate                  # read greedily (ctx.reference) on the trained layout
        return rendering_section(ctx.inp.rendered, ctx.evaluations, ctx.reference, ctx.layout,
                                 ctx.inp.tokenizer.decode, seed=ev.seed, n_boot=ev.bootstrap)

    def verdicts(self, sec: RenderingsSection, others=None) -> list[Verdict]:
        serving, trained = sec.row(sec.serving), sec.row(sec.trained)
        rows = {"rows": [to_json(r) for r in sec.rows]}
        if trained is serving:
            return [Verdict("rendering-match", "ok", f"The server renders prompts as the drafter was trained "
                            f"({sec.serving}): accept length {fmt(serving.accept_length)} on {sec.layout}, "
                            f"{sec.tree}.", rows)]
        if trained is None or trained.vs_serving is None:
            listing = ", ".join(f"{r.rendering} {fmt(r.accept_length)}" for r in sec.rows)
            return [Verdict("renderings", "info", f"Accept length by prompt rendering on {sec.layout}, "
                            f"{sec.tree} (serving: {sec.serving}): {listing}.", rows)]
        d, (lo, hi) = -trained.vs_serving.difference, trained.vs_serving.ci95
        lo, hi = -hi, -lo                                   # serving - trained
        differs = trained.differs_from_serving             # a row other than the serving one: never None
        evidence = {"serving": sec.serving, "trained": sec.trained, "serving_accept_length": serving.accept_length,
                    "trained_accept_length": trained.accept_length, "difference": d, "ci95": [lo, hi],
                    "differs": to_json(differs)}
        numbers = (f"accept length {fmt(serving.accept_length)} served vs {fmt(trained.accept_length)} "
                   f"with the training rendering on {sec.layout}, {sec.tree} (difference {d:+.2f}, "
                   f"95% CI [{lo:+.2f}, {hi:+.2f}], paired over {differs.prompts} prompts)")
        if hi < 0:
            text = (f"RENDERING MISMATCH: the server renders prompts as {sec.serving}, the drafter was trained "
                    f"on {sec.trained}: {numbers}; {_where(trained)}.")
            return [Verdict("rendering-mismatch", "warning", text, evidence)]
        text = (f"The serving rendering {sec.serving} costs no measurable acceptance against the training "
                f"rendering {sec.trained}: {numbers}.")
        return [Verdict("rendering-match", "ok", text, evidence)]

    def markdown(self, sec: RenderingsSection, rep: dict) -> list[str]:
        out = ["## Prompt renderings", "",
               f"Accept length of `{sec.layout}` on {sec.tree} under each rendering (its own target pass); "
               f"serving: `{sec.serving}`, trained: `{sec.trained or 'not given'}`. Difference to serving: paired "
               "bootstrap over prompts. First difference: where its tokens part from the serving render "
               "(decoded; the shared tokens before it, then each side).", "",
               "| rendering | role | accept length | 95% CI | vs serving [95% CI] | prompts rendered differently | "
               "first difference: before → serving / this |", "|---|---|---|---|---|---|---|"]
        for r in sec.rows:
            d = r.differs_from_serving
            ex = d.examples[0] if d and d.examples else None
            where = f"{quoted(ex.context)} → {quoted(ex.serving)} / {quoted(ex.other)}" if ex else "–"
            count = f"{d.prompts - d.identical} of {d.prompts}" if d else "–"
            vs = None if r.vs_serving is None else to_json(r.vs_serving)
            out.append(f"| `{r.rendering}` | {', '.join(r.roles) or '–'} | **{f(r.accept_length)}** | "
                       f"{ci(r.ci95)} | {difference_cell(vs)} | {count} | {where} |")
        if sec.templates:
            out += ["", "Templates: " + ", ".join(f"`{k}` = `{v}`" for k, v in sec.templates.items())]
        return out + [""]
