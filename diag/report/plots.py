"""Plots for report.md, drawn from the report dict only (PNG, Agg, byte-for-byte repeatable).

    acceptance_at_depth.png  P(a >= d) against depth d, one panel per tree shape, one line per
                             (layout, mode, regime) variant, over the trajectory's rounds
    accept_hist.png          share of verify rounds by accept length (a + 1, bonus included),
                             one panel per tree shape
    by_position.png          accept length over the rounds rooted in each position range, one
                             panel per tree shape, one line per variant
    (then the registered diagnoses' plots, diag/diagnoses/: the prompt side's, then the serving
    side's, e.g. speedup.png and drift.png)

Repeatable: no pyplot state, fixed figure sizes and DPI, PNG metadata without the matplotlib
version, variants drawn in sorted order. This module knows matplotlib and the report's keys;
it computes no metric (every number comes from the report).
"""

from __future__ import annotations

from pathlib import Path

from diag.diagnoses.hooks import plots_all
from diag.diagnoses.protocol import PROMPT_SIDE, SERVING


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


def prompt_side_plots(rep: dict, folder: Path) -> list[dict]:
    """The plots of the registered diagnoses on the prompt side (diag/diagnoses/), each
    diagnosis's cached by its section (plot_cache.cached_diagnosis_plots)."""
    from diag.report.plot_cache import cached_diagnosis_plots
    return plots_all(rep, folder, PLACES["prompt_side_plots"], draw=cached_diagnosis_plots)


def serving_plots(rep: dict, folder: Path) -> list[dict]:
    """The same for the diagnoses placed on the serving side (protocol.SERVING)."""
    from diag.report.plot_cache import cached_diagnosis_plots
    return plots_all(rep, folder, PLACES["serving_plots"], draw=cached_diagnosis_plots)


PLOTS = (acceptance_at_depth, accept_hist, by_position, prompt_side_plots, serving_plots)
# the order report.md links them; prompt_side_plots and serving_plots: the registered diagnoses'
# (diag/diagnoses/) of each place, a list each
# The report keys each plot reads, and nothing else: the plot cache (plot_cache.py) keys each
# PNG on them. A plot that reads another key must name it here. The diagnoses' plots are keyed
# on their own sections, plot_reads and module sources (plot_cache.cached_diagnosis_plots), so
# the per-plot cache here leaves them alone (UNCACHED).
READS = {"acceptance_at_depth": ("evaluations",), "accept_hist": ("evaluations",),
         "by_position": ("evaluations",)}
UNCACHED = ("prompt_side_plots", "serving_plots")   # cached per diagnosis, by its own key
PLACES = {"prompt_side_plots": PROMPT_SIDE, "serving_plots": SERVING}   # whose diagnoses each draws


def make_plots(rep: dict, folder: str | Path, stats: dict | None = None) -> list[dict]:
    """Draw every plot the report has data for into folder/plots/ (or copy it from the plot
    cache, plot_cache.py, when drawn before from the same data); returns
    [{"file": "plots/x.png", "title": ...}] in a fixed order (markdown links them)."""
    from diag.report.plot_cache import draw_all

    made = draw_all(PLOTS, rep, Path(folder), stats=stats)
    return [p for m in made for p in (m if isinstance(m, list) else [m]) if p is not None]
