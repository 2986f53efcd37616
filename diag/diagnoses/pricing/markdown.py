"""Will speculation pay? The step costs, then one row per tree shape: its round cost and
break-even accept length, and each variant's accept length and predicted speedup at the
reference regime; the plot of accept length against break-even (speedup.png: one dashed line
per topk through (D, break-even) of each shape, one scatter per layout of its measured accept
lengths at the report's reference axes).

Rendered from the section read back from report.json and the report's evaluations; computes
no number of its own.
"""

from __future__ import annotations

from pathlib import Path

from diag.diagnoses.pricing.section import SpeedupSection
from diag.replay.evaluation import ANY, Evaluation, reference_axes, select
from diag.report.sections.cells import f, header, row
from diag.report.views import plot_link, primary_rows, tree_order


def markdown(sec: SpeedupSection, rep: dict) -> list[str]:
    if not sec.rows:
        return []
    c = sec.costs
    verify = ", ".join(f"D={d}: {t * 1e3:.2f} ms" for d, t in c.t_verify.items())
    variants = [(e["layout"], e["mode"]) for e in primary_rows(rep)]
    ref = (rep.get("reference") or {}).get("regime")
    by = {(r.tree, r.layout, r.mode): r for r in sec.rows if r.regime == r.tokens_regime == ref}
    out = ["## Will speculation pay?", "",
           f"Step costs ({sec.source}): decode {c.t_decode * 1e3:.2f} ms, draft step "
           f"{c.t_draft * 1e3:.2f} ms, draft extend {c.t_draft_extend * 1e3:.2f} ms, verify {verify}. "
           "Break-even accept length = round cost / decode cost; above it speculation beats plain "
           f"decoding. Cells: accept length → predicted speedup, at regime {ref}." + _spread(sec), "",
           *header(["tree", "round cost", "break-even", *[f"`{lay}` {mode}" for lay, mode in variants]])]
    for tree in tree_order(rep):
        cells = [by.get((tree, lay, mode)) for lay, mode in variants]
        first = next((r for r in cells if r is not None), None)
        if first is None:
            continue
        even = "measurement error" if first.measurement_error else f(first.break_even_accept_length)
        out.append(row([tree, f"{first.round_cost_s * 1e3:.2f} ms",
                        even + ("" if first.break_even_reachable else " (unreachable)"),
                        *["" if r is None else f"{f(r.accept_length)} → {f(r.speedup)}x" for r in cells]]))
    return out + ["", *plot_link(rep, "speedup.png"), ""]


def _spread(sec: SpeedupSection) -> str:
    """Measured costs: a measurement with its spread, never a verdict."""
    if sec.basis != "measured" or not sec.spread:
        return ""
    d = sec.spread.t_decode
    return (f" Measured on this machine, {sec.repeats} calls each (decode {d.min * 1e3:.2f} / "
            f"{d.median * 1e3:.2f} / {d.max * 1e3:.2f} ms min / median / max): a measurement, not a verdict "
            "on your server. A break-even below 1 (a round cheaper than a plain step) is a measurement error.")


def _reference_rows(sec: SpeedupSection, rep: dict) -> list:
    """Rows of the variants at the report's reference axes (every layout and tree)."""
    if not sec.rows:
        return []
    where = reference_axes(rep).but(layout=ANY, tree=ANY)
    keys = {e.key for e in select([Evaluation.from_json(e) for e in rep.get("evaluations", [])], where)}
    return [r for r in sec.rows if r.break_even_accept_length is not None and r.key in keys]


def _break_even_curves(ax, rows: list) -> None:
    """One dashed line per topk through (D, break-even accept length) of each tree shape.
    The break-even depends on the shape and the costs only, not on the layout."""
    shapes = {r.tree: (r.topk, r.num_draft_tokens, r.break_even_accept_length) for r in rows}
    for k in sorted({v[0] for v in shapes.values()}):
        pts = sorted((d, be, tree) for tree, (kk, d, be) in shapes.items() if kk == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--" if k == 1 else "k:", marker="x",
                label=f"break-even, topk={k}")
        for d, be, tree in pts:
            ax.annotate(tree, (d, be), fontsize=7, textcoords="offset points", xytext=(4, -10))


def plot(sec: SpeedupSection, rep: dict, folder: Path) -> list[dict]:
    rows = _reference_rows(sec, rep)
    if not rows:
        return []
    from diag.report.figure import WIDE, figure, save     # matplotlib: only when a plot is drawn
    fig, (ax,) = figure(1, panel=WIDE)
    _break_even_curves(ax, rows)
    for lay in sorted({r.layout for r in rows}):
        pts = sorted((r.num_draft_tokens, r.accept_length) for r in rows
                     if r.layout == lay and r.accept_length is not None)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"{lay} (measured)", zorder=3)
    ax.set(xlabel="num_draft_tokens D (root included)", ylabel="accept length (bonus included)",
           title=f"speculation pays above its break-even (costs {sec.source})")
    ax.title.set_fontsize(9)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [save(fig, folder, "speedup.png", "Accept length vs break-even, per tree shape")]
