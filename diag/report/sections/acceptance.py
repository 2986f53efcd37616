"""Acceptance across every variant, compactly: one table of accept length by tree shape (one
row per layout, mode and regime), the per-depth and per-round plots, and acceptance by
position in the sequence as a plot plus one table of the primary tree."""

from __future__ import annotations

from diag.report.sections.cells import f, header, row
from diag.report.views import (plot_link, primary_rows, primary_tree, regime_label, served, tree_order,
                               variant_label)


def _rows_by_variant(rep: dict) -> dict[str, dict[str, dict]]:
    """variant label -> tree -> evaluation, variants ordered by their accept length on the
    primary tree (highest first), then the ones it lacks."""
    table: dict[str, dict[str, dict]] = {}
    for e in served(rep):
        table.setdefault(variant_label(e), {})[e["tree"]] = e
    tree = primary_tree(rep)

    def on_primary(label: str) -> float:
        e = table[label].get(tree)
        return -(e["accept_length"] if e and e["accept_length"] is not None else -1.0)
    return {k: table[k] for k in sorted(table, key=on_primary)}


def by_tree(rep: dict) -> list[str]:
    trees = tree_order(rep)
    if not trees:
        return []
    out = ["## Acceptance by tree shape", "",
           "Accept length (bonus included, over the rounds a real decode visits) of every variant; "
           "report.json has every count behind each cell.", "",
           *header(["layout", "mode", "regime", *trees])]
    for label, cells in _rows_by_variant(rep).items():
        e = next(iter(cells.values()))
        out.append(row([f"`{e['layout']}`", e["mode"], regime_label(e),
                        *[f(cells[t]["accept_length"]) if t in cells else "" for t in trees]]))
    return out + ["", *plot_link(rep, "acceptance_at_depth.png"), *plot_link(rep, "accept_hist.png"), ""]


def by_position(rep: dict) -> list[str]:
    rows = [e for e in primary_rows(rep) if e["by_position"]]
    if not rows:
        return []
    buckets = [(b["from"], b["to"], b["rounds"]) for b in rows[0]["by_position"]]
    out = ["## Acceptance by position in the sequence", "",
           f"Accept length over every round rooted in each range of positions, on {primary_tree(rep)} "
           "(the plot: every tree). Falling acceptance at long positions points at RoPE or "
           "context-length mismatches.", "",
           *header(["layout", "mode", *[f"[{a},{b}) ({n} rounds)" for a, b, n in buckets]])]
    for e in rows:
        by = {(b["from"], b["to"]): b["accept_length"] for b in e["by_position"]}
        out.append(row([f"`{e['layout']}`", e["mode"], *[f(by.get((a, b))) for a, b, _ in buckets]]))
    return out + ["", *plot_link(rep, "by_position.png"), ""]
