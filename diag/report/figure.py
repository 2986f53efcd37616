"""A matplotlib figure for the report's plots, laid out and saved the repeatable way: no pyplot
state, fixed sizes and DPI, PNG metadata without the matplotlib version. The report's plots
(plots.py) and the diagnoses' (diag/diagnoses/) draw on these; this module knows matplotlib
and file names, nothing about a report's keys.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100
PANEL = (4.2, 3.2)          # inches per panel
WIDE = (7.5, 4.5)           # a figure of one panel
COLUMNS = 3                 # panels per row
PNG_META = {"Software": None}


def figure(panels: int, panel: tuple[float, float] = PANEL) -> tuple[Figure, list]:
    """A figure with `panels` axes laid out COLUMNS to a row. 5 panels -> 2 rows x 3 columns,
    the sixth axes removed."""
    cols = min(COLUMNS, panels)
    rows = -(-panels // cols)
    fig = Figure(figsize=(panel[0] * cols, panel[1] * rows), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(rows * cols)]
    for ax in axes[panels:]:
        fig.delaxes(ax)
    return fig, axes[:panels]


def save(fig: Figure, folder: Path, name: str, title: str) -> dict:
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    fig.suptitle(title, fontsize=11)
    import warnings
    with warnings.catch_warnings():     # a crowded legend may not fit; the PNG is still right
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.set_layout_engine(None)         # laid out: savefig skips its own layout-only draw (a third
    # of the drawing time); tight_layout left a placeholder engine that made savefig draw twice
    fig.savefig(folder / "plots" / name, format="png", dpi=DPI, metadata=PNG_META)
    return {"file": f"plots/{name}", "title": title}
