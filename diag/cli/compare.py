"""`diag compare A B`: what changed between two reports (directories or report.json files).

Prints the terminal summary by default, the Markdown with --markdown, the plain data with
--json; --out FILE also writes the Markdown there (for a ticket). The comparison itself is
diag/report/compare.py; this module only parses flags and writes.
"""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("compare", help="what changed between two reports: acceptance, verdicts, provenance")
    p.add_argument("a", help="report A: a report directory or its report.json")
    p.add_argument("b", help="report B: a report directory or its report.json")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the comparison as JSON")
    fmt.add_argument("--markdown", action="store_true", help="print the comparison as Markdown")
    p.add_argument("--out", help="also write the Markdown comparison to this file")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.set_defaults(func=run)


def run(a) -> int:
    from diag.report.compare import compare, load_report, render_markdown, render_terminal
    from diag.report.outdir import check_out_file

    if a.out:                                   # before the work: never over a user's file
        check_out_file(a.out, _is_comparison, what="comparison Markdown")
    rep_a, file_a = load_report(a.a)
    rep_b, file_b = load_report(a.b)
    cmp = compare(rep_a, rep_b, a_path=str(file_a), b_path=str(file_b), seed=a.seed, n_boot=a.bootstrap)
    if a.json:
        print(json.dumps(cmp, indent=2))
    elif a.markdown:
        print(render_markdown(cmp), end="")
    else:
        print(render_terminal(cmp))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(render_markdown(cmp))
    return 0


def _is_comparison(path: Path) -> bool:
    """An earlier `diag compare --out` file: its first line is render_markdown's title."""
    with open(path, encoding="utf-8") as fh:
        return fh.readline().startswith("# diag compare: ")
