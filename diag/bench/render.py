"""Markdown summary of benchmark JSON files: a rendering of the numbers, never a second
computation (every figure is read from the JSON, each goal line names its key)."""

from __future__ import annotations

import json
from pathlib import Path

GOALS = (  # (text, section, key path, comparison, threshold)
    ("INT4 pass / bf16 grouped_mm throughput", "pass_2layer", ("throughput_ratio",), ">=", 0.8),
    ("INT4 / bf16 weight memory (routed experts of a layer)", "experts", ("weight_memory_ratio",), "<=", 0.3),
    ("MoE layer fraction of bf16 peak (8k tokens, dequant included)", "experts", ("rows", 8192), ">=", 0.4),
    ("drafter replay fraction of peak", "drafter", ("fraction_of_peak",), ">=", 0.3),
    ("speedup over the naive loop", "naive", ("speedup_over_naive",), ">=", 30),
    ("resident / checkpoint bytes", "checkpoint", ("resident_over_checkpoint",), "<=", 1.15),
    ("sampled loop cost / (num_draft_tokens x greedy pass), worst tree", "sampled",
     ("worst_cost_over_draft_tokens",), "<=", 1.0),
)


def _value(sec: dict, path: tuple):
    if path[0] == "rows":
        rows = [r for r in sec.get("rows", []) if r.get("tokens") == path[1]]
        return rows[0]["int4_fraction_of_peak"] if rows else None
    return sec.get(path[0])


def goal_lines(res: dict) -> list[str]:
    out = []
    for text, name, path, cmp, limit in GOALS:
        sec = res["sections"].get(name)
        if sec is None or "error" in sec:
            out.append(f"| {text} | not measured | {cmp} {limit} | - |")
            continue
        v = _value(sec, path)
        if v is None:
            out.append(f"| {text} | not measured | {cmp} {limit} | - |")
            continue
        ok = v >= limit if cmp == ">=" else v <= limit
        out.append(f"| {text} | {v:.3g} | {cmp} {limit} | {'met' if ok else 'NOT met'} |")
    return out


def render(paths: list[Path]) -> str:
    lines = ["# diag bench", ""]
    for p in paths:
        res = json.loads(Path(p).read_text())
        m = res["machine"]
        lines += [f"## {p.name} ({res['kind']})", "",
                  f"{m.get('gpu', 'CPU')}, torch {m['torch']}, transformers {m.get('transformers')}, "
                  f"git {res.get('git')}", ""]
        if res["kind"] == "gpu":
            lines += ["| goal | measured | target | |", "|---|---|---|---|", *goal_lines(res), ""]
        for name, sec in res["sections"].items():
            flat = {k: v for k, v in sec.items() if not isinstance(v, (dict, list)) and k != "traceback"}
            lines.append(f"- **{name}**: " + ", ".join(f"{k}={_fmt(v)}" for k, v in flat.items()))
            for row in sec.get("rows", []) if isinstance(sec.get("rows"), list) else []:
                lines.append("  - " + ", ".join(f"{k}={_fmt(v)}" for k, v in row.items()))
        lines.append("")
    return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
