"""Table cells shared by report.md's sections. Knows number formatting; nothing else."""

from __future__ import annotations

ICON = {"error": "❌", "warning": "⚠️", "ok": "✅", "info": "ℹ️"}


def f(x, nd: int = 2) -> str:
    """2.0 -> "2.00"; None -> "–"."""
    return "–" if x is None else f"{x:.{nd}f}"


def ci(pair) -> str:
    lo, hi = pair
    return "–" if lo is None else f"{lo:.2f}–{hi:.2f}"


def row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(names) -> list[str]:
    return [row(names), "|" + "---|" * len(names)]
