"""The renderings section of a report: acceptance per prompt rendering, and where each
rendering's token ids part from the serving one.

Per rendering (serving first), on the trained layout (the best eagle3 candidate at the
reference axes) and the primary tree: the trajectory accept length with its interval, the
paired difference to the serving rendering (the same prompts resampled in both arms), and the
first tokens where its render and the serving render differ, decoded (render_diff.py). The
"trained" row is the rendering the drafter was trained with, when the case says so.

Worked example: serving chat+think 2.10, trained chat+nothink 3.05 -> the trained row's
vs_serving is +0.95 [CI]; its first difference is at the generation prompt, serving
"<think>" vs trained "<think></think>". This module reads Evaluation records and token ids;
no models, no files.
"""

from __future__ import annotations

from diag.replay.evaluation import Axes, one
from diag.run.render_diff import differences
from diag.stats import paired_bootstrap_diff


def _row(name: str, roles: list[str], e, base, diff: dict | None, *, seed: int, n_boot: int) -> dict:
    row = {"rendering": name, "roles": roles, "accept_length": None, "ci95": [None, None],
           "vs_serving": None, "differs_from_serving": diff}
    if e is None or e.accept_length is None:
        return row
    row.update(accept_length=e.accept_length, ci95=list(e.accept_length_ci95))
    if base is not None and e is not base and base.accept_length is not None:
        d, lo, hi = paired_bootstrap_diff(e.trajectory_rounds, base.trajectory_rounds, seed=seed, n=n_boot)
        row["vs_serving"] = {"difference": d, "ci95": [lo, hi]}
    return row


def rendering_section(rendered, evals, where: Axes, layout: str | None, decode, *,
                      seed: int, n_boot: int) -> dict | None:
    """`rendered`: RenderedPrompts; `where`: the run's reference axes (serving rendering)."""
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
    return {"serving": rendered.serving, "trained": rendered.trained, "layout": layout, "tree": where.tree,
            "templates": dict(rendered.templates), "rows": rows}
