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
from pathlib import Path

from diag.report.envelope import envelope, samples_text
from diag.report.markdown import render
from diag.report.outdir import check_out_dir, partial_dir, swap_into_place, write_manifest
from diag.report.plots import make_plots


def write_report(run, out_dir: str | Path, argv: list[str] | None = None) -> tuple[Path, dict]:
    out = check_out_dir(out_dir)
    tmp = partial_dir(out)
    try:
        rep = envelope(run, argv)
        rep["plots"] = make_plots(rep, tmp)
        (tmp / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
        (tmp / "samples.jsonl").write_text(samples_text(run))
        (tmp / "report.md").write_text(render(rep))
        write_manifest(tmp)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(out_dir), rep
