"""Plots for report.md, drawn from the report dict only (PNG, Agg, byte-for-byte repeatable).

    acceptance_at_depth.png  P(a >= d) against depth d, one panel per tree shape, one line per
                             (layout, mode, regime) variant, over the trajectory's rounds
    accept_hist.png          share of verify rounds by accept length (a + 1, bonus included),
                             one panel per tree shape
    by_position.png          accept length over the rounds rooted in each position range, one
                             panel per tree shape, one line per variant
    drift.png                only when the report has a `regimes` section with a regime besides
                             the reference: relative L2 and cosine of each capture point, per regime
    speedup.png              only when the report has a `speedup` section: accept length against
                             num_draft_tokens per tree shape, with the break-even accept length
    (the registered diagnoses' plots, diag/diagnoses/, between by_position and speedup)

Section shapes read here (report.schema.json has them too):
    regimes  = {"reference", "points": [...], "regimes": [{"regime", "drift": {point: {"cosine",
                "relative_l2"}}, ...}], ...}                        (diag/run/regime_section.py)
    speedup  = {"source": "...", "costs": {...}, "rows": [{"tree": "chain-3", "layout", "mode",
                "regime", "tokens_regime", "topk", "num_draft_tokens", "accept_length",
                "break_even_accept_length", ...}, ...]}      (diag/run/pricing.py)

Repeatable: no pyplot state, fixed figure sizes and DPI, PNG metadata without the matplotlib
version, variants drawn in sorted order. This module knows matplotlib and the report's keys;
it computes no metric (every number comes from the report).
"""

from __future__ import annotations

from pathlib import Path

from diag.diagnoses.hooks import plots_all
from diag.replay.evaluation import ANY, Evaluation, reference_axes, select


def _figure(panels: int, wide: bool = False):
    from diag.report.figure import PANEL, WIDE, figure    # matplotlib: imported only when a plot is drawn
    return figure(panels, WIDE if wide else PANEL)


def _save(fig, folder: Path, name: str, title: str) -> dict:
    from diag.report.figure import save
    return save(fig, folder, name, title)


def _label(e: dict) -> str:
    """embed+L2+L4 eagle3 as-loaded; a cross-regime variant reads w4a16-g32>as-loaded."""
    reg = e["regime"] if e["regime"] == e["tokens_regime"] else f"{e['regime']}>{e['tokens_regime']}"
    return f"{e['layout']} {e['mode']} {reg}"


def _by_tree(rep: dict) -> dict[str, list[dict]]:
    """Evaluations with at least one trajectory round, grouped by tree, in a fixed order:
    trees by (num_steps, topk, num_draft_tokens), variants by label."""
    groups: dict[str, list[dict]] = {}
    for e in rep.get("evaluations", []):
        if e["trajectory"]["rounds"]:
            groups.setdefault(e["tree"], []).append(e)
    order = sorted(groups, key=lambda t: (groups[t][0]["num_steps"], groups[t][0]["topk"],
                                          groups[t][0]["num_draft_tokens"]))
    return {t: sorted(groups[t], key=_label) for t in order}


def acceptance_at_depth(rep: dict, folder: Path) -> dict | None:
    groups = _by_tree(rep)
    if not groups:
        return None
    fig, axes = _figure(len(groups))
    for ax, (tree, evals) in zip(axes, groups.items()):
        for e in evals:
            depth = e["trajectory"]["acceptance_at_depth"]
            ax.plot(range(1, len(depth) + 1), depth, marker="o", label=_label(e))
        ax.set(title=tree, xlabel="depth d", ylabel="P(a >= d)", ylim=(-0.02, 1.02))
        ax.set_xticks(range(1, evals[0]["num_steps"] + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, folder, "acceptance_at_depth.png",
                 "Acceptance at depth, over the rounds a real decode visits")


def accept_hist(rep: dict, folder: Path) -> dict | None:
    groups = _by_tree(rep)
    if not groups:
        return None
    fig, axes = _figure(len(groups))
    for ax, (tree, evals) in zip(axes, groups.items()):
        width = 0.8 / len(evals)
        for i, e in enumerate(evals):
            hist, rounds = e["trajectory"]["accepted_hist"], e["trajectory"]["rounds"]
            x = [a + 1 + (i - (len(evals) - 1) / 2) * width for a in range(len(hist))]  # accept length a+1
            ax.bar(x, [n / rounds for n in hist], width=width, label=_label(e))
        ax.set(title=tree, xlabel="accept length (a + 1, bonus included)", ylabel="share of rounds",
               ylim=(0, 1.02))
        ax.set_xticks(range(1, evals[0]["num_steps"] + 2))
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, folder, "accept_hist.png", "Accept length per verify round (trajectory)")


def by_position(rep: dict, folder: Path) -> dict | None:
    groups = {t: [e for e in evals if e["by_position"]] for t, evals in _by_tree(rep).items()}
    groups = {t: evals for t, evals in groups.items() if evals}
    if not groups:
        return None
    fig, axes = _figure(len(groups))
    for ax, (tree, evals) in zip(axes, groups.items()):
        names = [f"[{b['from']},{b['to']})" for b in evals[0]["by_position"]]
        for e in evals:
            ax.plot(range(len(e["by_position"])), [b["accept_length"] for b in e["by_position"]],
                    marker="o", label=_label(e))
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set(title=tree, xlabel="position of the round's root", ylabel="accept length", ylim=(0.9, None))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    return _save(fig, folder, "by_position.png", "Accept length by position in the sequence (every round)")


def drift(rep: dict, folder: Path) -> dict | None:
    sec = rep.get("regimes") or {}
    rows = [r for r in sec.get("regimes", []) if r["regime"] != sec.get("reference") and r.get("drift")]
    if not rows:
        return None
    points = sec["points"]                                   # residual-stream order: embed, L1, ..., final
    fig, (ax_l2, ax_cos) = _figure(2)
    for r in sorted(rows, key=lambda r: r["regime"]):
        xs = [i for i, p in enumerate(points) if p in r["drift"]]
        label = f"{r['regime']} vs {sec['reference']}"
        ax_l2.plot(xs, [r["drift"][points[i]]["relative_l2"] for i in xs], marker="o", label=label)
        ax_cos.plot(xs, [r["drift"][points[i]]["cosine"] for i in xs], marker="o", label=label)
    for ax, name in ((ax_l2, "relative L2"), (ax_cos, "mean cosine")):
        ax.set_xticks(range(len(points)), points, rotation=45, fontsize=8)
        ax.set(xlabel="capture point", ylabel=name, title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, folder, "drift.png", "Hidden-state drift per capture point vs the reference regime")


def _reference_rows(rep: dict) -> list[dict]:
    """Speedup rows of the variants at the report's reference axes (every layout and tree)
    that have a break-even number."""
    rows = (rep.get("speedup") or {}).get("rows", [])
    if not rows:
        return []
    where = reference_axes(rep).but(layout=ANY, tree=ANY)
    keys = {e.key for e in select([Evaluation.from_json(e) for e in rep.get("evaluations", [])], where)}
    return [r for r in rows if r.get("break_even_accept_length") is not None and r["key"] in keys]


def _break_even_curves(ax, rows: list[dict]) -> None:
    """One dashed line per topk through (D, break-even accept length) of each tree shape.
    The break-even depends on the shape and the costs only, not on the layout."""
    shapes = {r["tree"]: (r["topk"], r["num_draft_tokens"], r["break_even_accept_length"]) for r in rows}
    for k in sorted({v[0] for v in shapes.values()}):
        pts = sorted((d, be, tree) for tree, (kk, d, be) in shapes.items() if kk == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--" if k == 1 else "k:", marker="x",
                label=f"break-even, topk={k}")
        for d, be, tree in pts:
            ax.annotate(tree, (d, be), fontsize=7, textcoords="offset points", xytext=(4, -10))


def speedup(rep: dict, folder: Path) -> dict | None:
    rows = _reference_rows(rep)
    if not rows:
        return None
    fig, (ax,) = _figure(1, wide=True)
    _break_even_curves(ax, rows)
    for lay in sorted({r["layout"] for r in rows}):
        pts = sorted((r["num_draft_tokens"], r["accept_length"]) for r in rows
                     if r["layout"] == lay and r.get("accept_length") is not None)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"{lay} (measured)", zorder=3)
    ax.set(xlabel="num_draft_tokens D (root included)", ylabel="accept length (bonus included)",
           title=f"speculation pays above its break-even (costs {rep['speedup']['source']})")
    ax.title.set_fontsize(9)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, folder, "speedup.png", "Accept length vs break-even, per tree shape")


PLOTS = (acceptance_at_depth, accept_hist, by_position, plots_all, speedup, drift)   # the order report.md links them;
# plots_all: the registered diagnoses' (diag/diagnoses/), a list each
# The report keys each plot reads, and nothing else: the plot cache (plot_cache.py) keys each
# PNG on them. A plot that reads another key must name it here. The diagnoses' plots are drawn
# every time (UNCACHED): their code lives outside this file, whose source is in the cache key.
READS = {"acceptance_at_depth": ("evaluations",), "accept_hist": ("evaluations",),
         "by_position": ("evaluations",),
         "speedup": ("speedup", "evaluations", "reference"), "drift": ("regimes",)}
UNCACHED = ("plots_all",)


def make_plots(rep: dict, folder: str | Path) -> list[dict]:
    """Draw every plot the report has data for into folder/plots/ (or copy it from the plot
    cache, plot_cache.py, when drawn before from the same data); returns
    [{"file": "plots/x.png", "title": ...}] in a fixed order (markdown links them)."""
    from diag.report.plot_cache import draw_all

    made = draw_all(PLOTS, rep, Path(folder))
    return [p for m in made for p in (m if isinstance(m, list) else [m]) if p is not None]
