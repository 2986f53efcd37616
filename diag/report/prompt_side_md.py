"""report.md sections for the prompt side of a run: acceptance by dataset, by prompt
rendering, then the registered diagnoses' (diag/diagnoses/). Rendered from report.json only;
nothing here computes a number.
"""

from __future__ import annotations

from diag.diagnoses.hooks import markdown_all
from diag.replay.evaluation import Evaluation, reference_axes, select
from diag.report.sections.cells import ci, difference, f
from diag.report.views import quoted as _q


def datasets(rep: dict) -> list[str]:
    """Accept length per prompt category for every layout at the reference axes."""
    where = reference_axes(rep)
    keys = {e.key for e in select([Evaluation.from_json(e) for e in rep["evaluations"]], where)}
    rows = [e for e in rep["evaluations"] if e["key"] in keys and e.get("by_category")]
    cats = sorted({c["category"] for e in rows for c in e["by_category"]})
    if len(cats) < 2:
        return []
    out = ["## Acceptance by dataset", "",
           f"Trajectory accept length per prompt category at the reference ({where.tree}, {where.regime}, "
           f"rendering {where.rendering}), 95% CI over the category's prompts.", "",
           "| layout | mode | " + " | ".join(f"{c}" for c in cats) + " |", "|---|---" + "|---" * len(cats) + "|"]
    for e in sorted(rows, key=lambda e: -(e["accept_length"] or 0)):
        by = {c["category"]: c for c in e["by_category"]}
        cells = [f"{f(by[c]['accept_length'])} [{ci(by[c]['ci95'])}] ({by[c]['prompts']})" if c in by else "–"
                 for c in cats]
        out.append(f"| `{e['layout']}` | {e['mode']} | " + " | ".join(cells) + " |")
    return out + [""]


def renderings(rep: dict) -> list[str]:
    sec = rep.get("renderings")
    if not sec:
        return []
    out = ["## Prompt renderings", "",
           f"Accept length of `{sec['layout']}` on {sec['tree']} under each rendering (its own target pass); "
           f"serving: `{sec['serving']}`, trained: `{sec['trained'] or 'not given'}`. Difference to serving: paired "
           "bootstrap over prompts. First difference: where its tokens part from the serving render "
           "(decoded; the shared tokens before it, then each side).", "",
           "| rendering | role | accept length | 95% CI | vs serving [95% CI] | prompts rendered differently | "
           "first difference: before → serving / this |", "|---|---|---|---|---|---|---|"]
    for r in sec["rows"]:
        vs_cell = difference(r["vs_serving"])
        d = r["differs_from_serving"]
        ex = d["examples"][0] if d and d["examples"] else None
        where = f"{_q(ex['context'])} → {_q(ex['serving'])} / {_q(ex['other'])}" if ex else "–"
        count = f"{d['prompts'] - d['identical']} of {d['prompts']}" if d else "–"
        out.append(f"| `{r['rendering']}` | {', '.join(r['roles']) or '–'} | **{f(r['accept_length'])}** | "
                   f"{ci(r['ci95'])} | {vs_cell} | {count} | {where} |")
    if sec.get("templates"):
        out += ["", "Templates: " + ", ".join(f"`{k}` = `{v}`" for k, v in sec["templates"].items())]
    return out + [""]


SECTIONS = (datasets, renderings, markdown_all)


def prompt_side(rep: dict) -> list[str]:
    return [line for section in SECTIONS for line in section(rep)]
