"""report.md sections for the prompt side of a run: acceptance by dataset, then the registered
diagnoses' (diag/diagnoses/: prompt renderings, coverage, ...). Rendered from report.json only;
nothing here computes a number.
"""

from __future__ import annotations

from diag.diagnoses.hooks import markdown_all
from diag.replay.evaluation import Evaluation, reference_axes, select
from diag.report.sections.cells import ci, f


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


SECTIONS = (datasets, markdown_all)


def prompt_side(rep: dict) -> list[str]:
    return [line for section in SECTIONS for line in section(rep)]
