"""`diag bench gpu|cpu|render`: the command-line edge of diag.bench."""

from __future__ import annotations

import tempfile
from pathlib import Path

from diag.bench import GPU_SECTIONS


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure diag's speed and memory on this machine")
    p.add_argument("where", choices=["gpu", "cpu", "render"], help="which benchmark (or render JSON to markdown)")
    p.add_argument("--out", help="result JSON (default reports/bench/<where>.json); render: markdown file")
    p.add_argument("--workdir", help="where the Kimi-shaped checkpoint is written (default: a temp dir)")
    p.add_argument("--max-layers", type=int, default=61, help="gpu: grow the target to at most this many layers")
    p.add_argument("--only", action="append", default=[], choices=list(GPU_SECTIONS),
                   help="gpu: run only these sections (repeat), after the ceilings and the checkpoint")
    p.add_argument("inputs", nargs="*", help="render: JSON files")
    p.set_defaults(func=run)


def run(a) -> int:
    if a.where == "render":
        from diag.bench.render import render
        text = render([Path(x) for x in a.inputs])
        Path(a.out or "reports/bench/summary.md").write_text(text + "\n")
        print(text)
        return 0
    out = Path(a.out or f"reports/bench/{a.where}.json")
    with tempfile.TemporaryDirectory(prefix="diag-bench-") as tmp:
        work = Path(a.workdir) if a.workdir else Path(tmp)
        if a.where == "gpu":
            from diag.bench.gpu import run as gpu_run
            gpu_run(out, work, max_layers=a.max_layers, only=tuple(a.only))
        else:
            from diag.bench.cpu import run as cpu_run
            cpu_run(out, work)
    print(f"results: {out}")
    return 0
