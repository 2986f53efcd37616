"""Are two report folders the same apart from when, where and how long? For refactors that
must change nothing ("nothing else changes", issue 33): run the same cases before and after,
then

    python scripts/same_reports.py BEFORE_ROOT AFTER_ROOT [--drop-section NAME ...]

compares every case folder under BEFORE_ROOT with the one of the same name under AFTER_ROOT,
byte for byte after normalising: report.json's `created`, `timings`, `provenance.git`, each
pass's `seconds`, the two roots and the checkouts' case folders; report.md's `(git ...)`, its
`- timings:` line and the same paths; samples.jsonl and every
PNG exactly. `--drop-section NAME` removes a section a later change added on purpose (its
report.json key, its `## ` Markdown section, its verdicts of kind NAME) from the after side.
Prints one line per case and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path


def _json(path: Path, root: str, drop: list[str]) -> str:
    rep = json.loads(path.read_text())
    rep.pop("created", None)
    rep.pop("timings", None)
    rep["provenance"].pop("git", None)
    _drop_seconds(rep.get("target_pass"))      # how long each pass (or its cache read) took
    for name in drop:
        rep.pop(name, None)
        rep["verdicts"] = [v for v in rep["verdicts"] if v["kind"].replace("-", "_") not in drop]
    return _paths(json.dumps(rep, indent=1, sort_keys=False), root)


def _drop_seconds(node) -> None:
    if isinstance(node, dict):
        node.pop("seconds", None)
        for v in node.values():
            _drop_seconds(v)
    elif isinstance(node, list):
        for v in node:
            _drop_seconds(v)


def _paths(text: str, root: str) -> str:
    """The report root and the checkout the case files were read from."""
    return re.sub(r"/[^\s\"`']*/diag/cases/", "<TREE>/diag/cases/", text.replace(root, "<ROOT>"))


def _md(path: Path, root: str, drop_titles: list[str]) -> str:
    text = _paths(re.sub(r"\(git `[^`]*`\)", "(git <GIT>)", path.read_text()), root)
    text = re.sub(r"^- timings: .*$", "- timings: <TIMINGS>", text, flags=re.M)
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            skipping = any(line[3:].lower().startswith(t) for t in drop_titles)
        if not skipping and not any(t in line.lower() for t in drop_titles if line.startswith("- ")):
            out.append(line)
    return "\n".join(out)


def compare(before: Path, after: Path, drop: list[str]) -> list[str]:
    problems = []
    titles = [d.replace("_", " ").replace("-", " ") for d in drop]
    for b in sorted(p for p in before.rglob("*") if p.is_file()):
        rel = b.relative_to(before)
        a = after / rel
        if not a.is_file():
            problems.append(f"{rel}: missing after")
            continue
        if b.name == "report.json":
            x, y = _json(b, str(before.parent), []), _json(a, str(after.parent), drop)
        elif b.name == "report.md":
            x, y = _md(b, str(before.parent), []), _md(a, str(after.parent), titles)
        else:
            x, y = b.read_bytes(), a.read_bytes()
        if x != y:
            diff = "" if isinstance(x, bytes) else "\n".join(list(difflib.unified_diff(
                x.splitlines(), y.splitlines(), lineterm="", n=0))[:12])
            problems.append(f"{rel}: differs\n{diff}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--drop-section", action="append", default=[])
    a = ap.parse_args(argv)
    bad = 0
    for case in sorted(p for p in a.before.iterdir() if (p / "report.json").is_file()):
        problems = compare(case, a.after / case.name, a.drop_section)
        files = sum(1 for p in case.rglob("*") if p.is_file())
        print(f"{case.name}: {'same' if not problems else 'DIFFERENT'} ({files} files)")
        for p in problems:
            print("   ", p)
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
