"""Writing a report directory atomically: report.json, report.md, samples.jsonl, plots.

Everything is written into a sibling temporary directory first and renamed into place at
the end, so a failure never leaves a partial report that looks whole. This module knows
files; the content comes from envelope.py, markdown.py and plots.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from diag.report.envelope import envelope, samples
from diag.report.markdown import render
from diag.report.plots import make_plots


def write_report(run, out_dir: str | Path, argv: list[str] | None = None) -> tuple[Path, dict]:
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        rep = envelope(run, argv)
        rep["plots"] = make_plots(rep, tmp)
        (tmp / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
        with open(tmp / "samples.jsonl", "w") as fh:
            for row in samples(run):
                fh.write(json.dumps(row) + "\n")
        (tmp / "report.md").write_text(render(rep))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, rep

