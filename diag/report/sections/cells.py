"""Table cells shared by report.md's sections. Knows number formatting; nothing else."""

from __future__ import annotations

ICON = {"error": "❌", "warning": "⚠️", "ok": "✅", "info": "ℹ️"}


def f(x, nd: int = 2) -> str:
    """2.0 -> "2.00"; None -> "–"."""
    return "–" if x is None else f"{x:.{nd}f}"


def ci(pair, nd: int = 2) -> str:
    """(1.94, 2.25) -> "1.94–2.25"; None, () or (None, None) -> "–"."""
    if not pair or pair[0] is None:
        return "–"
    return f"{f(pair[0], nd)}–{f(pair[1], nd)}"


def difference(vs: dict | None) -> str:
    """A paired difference with its interval: {"difference": 0.14, "ci95": [0.08, 0.19]} ->
    "+0.14 [+0.08, +0.19]"; None -> "–"."""
    if not vs:
        return "–"
    return f"{vs['difference']:+.2f} [{vs['ci95'][0]:+.2f}, {vs['ci95'][1]:+.2f}]"


def row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(names) -> list[str]:
    return [row(names), "|" + "---|" * len(names)]
