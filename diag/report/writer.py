"""Writing a report directory atomically: report.json, report.md, samples.jsonl, plots.

Everything is written into a sibling partial directory first, listed in diag's manifest,
and swapped into place in one step (outdir.py), so a failure or an interrupt never leaves a
partial report that looks whole, and never removes a directory diag did not write. This
module knows which files make a report; the content comes from envelope.py, markdown.py
and plots.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from diag.report.envelope import envelope, samples_text
from diag.report.markdown import render
from diag.report.outdir import check_out_dir, partial_dir, swap_into_place, write_manifest
from diag.report.plots import make_plots


def write_report(run, out_dir: str | Path, argv: list[str] | None = None,
                 phases: dict | None = None) -> tuple[Path, dict]:
    """`phases`, when given, receives each step's seconds (envelope_s, figures_s, json_s,
    samples_s, markdown_s, publish_s) and the figures' counts (plot_cache.draw_all's
    figures_drawn, figure_workers): what a report costs, for the bench."""
    out = check_out_dir(out_dir)
    tmp = partial_dir(out)
    clock = _Clock(phases)
    try:
        rep = envelope(run, argv)
        clock("envelope_s")
        rep["plots"] = make_plots(rep, tmp, stats=phases)
        clock("figures_s")
        (tmp / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
        clock("json_s")
        (tmp / "samples.jsonl").write_text(samples_text(run))
        clock("samples_s")
        (tmp / "report.md").write_text(render(rep))
        clock("markdown_s")
        write_manifest(tmp)
        swap_into_place(tmp, out)
        clock("publish_s")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(out_dir), rep


class _Clock:
    """clock(name): the seconds since the last call into phases[name] (nothing without phases)."""

    def __init__(self, phases: dict | None):
        self.phases, self.t = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        if self.phases is not None:
            self.phases[name] = round(now - self.t, 4)
        self.t = now
