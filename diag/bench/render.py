"""Markdown summary of benchmark JSON files: a rendering of the numbers, never a second
computation (every figure is read from the JSON, each goal line names its key)."""

from __future__ import annotations

import json
from pathlib import Path

GOALS = (  # (text, section, key path, comparison, threshold); "rows>=8192": the worst such row
    ("diag load / raw sequential read, page cache dropped", "load", ("ratio_cold",), ">=", 0.8),
    ("diag load / raw sequential read, warm", "load", ("ratio_warm",), ">=", 0.8),
    ("plain cold load / raw cold read (s / s)", "load", ("plain_over_raw",), "<=", 1.25),
    ("first-run load (content digest in the read) / plain cold load (s / s)", "load",
     ("first_run_over_plain",), "<=", 1.1),
    ("Kimi 61 layers, 8 GPUs: first verdict after the load (s, extrapolated)", "extrapolation",
     ("first_verdict_after_load_s",), "<=", 300),
    ("Kimi 61 layers, 8 GPUs, T=1.0 top-p 0.95: first sampled verdict after the load (s, extrapolated)",
     "extrapolation", ("sampled", "first_sampled_verdict_after_load_s"), "<=", 300),
    ("Kimi 61 layers, 8 GPUs, T=1.0 top-p 0.95: each further sampled variant, the repeat run in all "
     "(s, extrapolated)", "extrapolation", ("sampled", "further_sampled_variant_s"), "<=", 10),
    ("Kimi 61 layers, 8 GPUs, T=1.0 top-p 0.95: each further sampled variant, the target kept loaded "
     "(diag run --watch; s, extrapolated)", "extrapolation", ("sampled", "further_sampled_variant_kept_s"), "<=", 10),
    ("... and each layer's experts split over the 8 GPUs ([placement] experts = \"split\"; s, extrapolated)",
     "extrapolation", ("sampled", "further_sampled_variant_kept_split_s"), "<=", 10),
    ("each further layout x tree from the cache (s)", "e2e", ("cached_seconds_per_variant",), "<=", 1.0),
    ("repeat run: checks on the cached run (s)", "e2e", ("cached", "checks_s"), "<=", 2.0),
    ("repeat run: one more layout on a cached case, in all (s)", "e2e", ("one_more_layout", "wall_s"), "<=", 5.0),
    ("one more layout on a cached case, the target kept loaded (diag run --watch), in all (s)", "e2e",
     ("one_more_layout_kept", "wall_s"), "<=", 5.0),
    ("INT4 pass / bf16 grouped_mm throughput", "pass_2layer", ("throughput_ratio",), ">=", 0.8),
    ("INT4 / bf16 weight memory (routed experts of a layer)", "experts", ("weight_memory_ratio",), "<=", 0.3),
    ("MoE layer fraction of bf16 peak (8k tokens, dequant included)", "experts", ("rows", 8192), ">=", 0.4),
    ("MoE layer fraction of bf16 peak (worst of >= 8k tokens)", "experts", ("rows>=8192",), ">=", 0.4),
    ("drafter replay fraction of peak", "drafter", ("fraction_of_peak",), ">=", 0.3),
    ("speedup over the naive loop (competent version)", "naive", ("speedup_over_naive",), ">=", 30),
    ("resident / checkpoint bytes", "checkpoint_load", ("resident_over_checkpoint",), "<=", 1.15),
    ("sampled verify forward: bytes read / copy bandwidth, worst tree", "sampled",
     ("verify_fraction_of_copy_bandwidth_min",), ">=", 0.5),
    ("sampled verify forward once its CUDA graphs are captured: bytes read / copy bandwidth, worst tree",
     "sampled", ("verify_replay_fraction_of_copy_bandwidth_min",), ">=", 0.5),
    ("greedy decode step: bytes read / copy bandwidth, worst batch", "decode_bandwidth",
     ("fraction_of_copy_bandwidth_min",), ">=", 0.5),
    ("sampled loop cost / (num_draft_tokens x greedy pass), worst tree", "sampled",
     ("worst_cost_over_draft_tokens",), "<=", 1.0),
    ("trained zoo pair: sampled loop cost / (num_draft_tokens x greedy pass), worst tree", "sampled_trained",
     ("worst_cost_over_draft_tokens",), "<=", 1.0),
    ("demo-sampled minus the cached demo, side by side (s)", "sampled_trained",
     ("demo_sampled_minus_demo_seconds",), "<=", 30),
    ("zoo: the demo's checkpoints from an empty cache (s, 2 cores)", "zoo", ("demo_seconds",), "<=", 180),
    ("zoo: the whole zoo from an empty cache (s, 2 cores)", "zoo", ("whole_seconds",), "<=", 300),
)
MAX_ROWS = 12


def _value(sec: dict, path: tuple):
    if path[0] == "rows":
        rows = [r for r in sec.get("rows", []) if r.get("tokens") == path[1]]
        return rows[0]["int4_fraction_of_peak"] if rows else None
    if path[0] == "rows>=8192":
        vals = [r["int4_fraction_of_peak"] for r in sec.get("rows", []) if r.get("tokens", 0) >= 8192]
        return min(vals) if vals else None
    for key in path:                     # ("cached", "checks_s") -> sec["cached"]["checks_s"]
        sec = sec.get(key) if isinstance(sec, dict) else None
    return sec


CPU_GOALS = {"zoo", "sampled_trained"}     # the sections whose goals are the CPU's; every other goal is the GPU's
ANY_KIND = {("load", "plain_over_raw"), ("load", "first_run_over_plain"),     # both machines' goals
            ("e2e", "cached"), ("e2e", "one_more_layout")}
OPTIONAL = {("extrapolation", "sampled"),            # rows of a part only some runs have (a sampled e2e;
            ("sampled", "verify_replay_fraction_of_copy_bandwidth_min")}   # a verify from graphs): absent, no row
SINCE_KEPT = {("extrapolation", ("sampled", "further_sampled_variant_kept_s")),     # e2e runs made before the
              ("e2e", ("one_more_layout_kept", "wall_s")),                          # kept run existed: no row
              ("extrapolation", ("sampled", "further_sampled_variant_kept_split_s"))}


def goal_lines(res: dict) -> list[str]:
    out = []
    for text, name, path, cmp, limit in GOALS:
        if "kind" in res and (name, path[0]) not in ANY_KIND and (res["kind"] == "cpu") != (name in CPU_GOALS):
            continue
        sec = res["sections"].get(name)
        v = None if sec is None or "error" in sec else _value(sec, path)
        if v is None:
            if sec is not None and not ((name, path[0]) in OPTIONAL and path[0] not in sec) \
                    and (name, path) not in SINCE_KEPT:
                out.append(f"| {text} | not measured | {cmp} {limit} | - |")
            continue
        ok = v >= limit if cmp == ">=" else v <= limit
        why = _undecided(sec, path)
        verdict = f"undecided ({why})" if why else ("met" if ok else "NOT met")
        out.append(f"| {text} | {_shown(v, cmp, limit)} | {cmp} {limit} | {verdict} |")
    return out


def _shown(v: float, cmp: str, limit: float) -> str:
    """v to 3 significant digits, or as many more (up to 6) as it takes for the printed number to
    sit on the same side of the limit as v: 10.016 against <= 10 reads "10.02", not "10" beside
    "NOT met"."""
    holds = (lambda x: x >= limit) if cmp == ">=" else (lambda x: x <= limit)
    for digits in range(3, 7):
        text = f"{v:.{digits}g}"
        if holds(float(text)) == holds(v):
            return text
    return text


def _undecided(sec: dict, path: tuple) -> str | None:
    """Why the section's own goal entry beside the figure (path[:-1] + ("goals", path[-1])) says
    neither met nor not (`met: null`, its `undecided`: bench/extrapolate's split figure with its
    saving capped, or a lower bound under the limit); None where it decides."""
    goal = _value(sec, (*path[:-1], "goals", path[-1])) if len(path) > 1 else None
    if isinstance(goal, dict) and "met" in goal and goal["met"] is None:
        return goal.get("undecided", "a term capped: optimistic")     # files written before the key
    return None


def _flat(d: dict) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in d.items() if not isinstance(v, (dict, list))
                     and k != "traceback")


def _section_lines(name: str, sec: dict) -> list[str]:
    lines = [f"- **{name}**: " + _flat(sec)]
    for key, v in sec.items():
        if isinstance(v, dict) and v:
            lines.append(f"  - {key}: " + (_flat(v) or json.dumps(v, default=str)[:300]))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for row in v[:MAX_ROWS]:
                lines.append(f"  - {key}: " + _flat(row))
            if len(v) > MAX_ROWS:
                lines.append(f"  - {key}: ({len(v) - MAX_ROWS} more in the JSON)")
    return lines


def render(paths: list[Path]) -> str:
    lines = ["# diag bench", ""]
    for p in paths:
        res = json.loads(Path(p).read_text())
        m = res["machine"]
        lines += [f"## {p.name} ({res['kind']})", "",
                  f"{m.get('gpu', 'CPU')}, torch {m['torch']}, transformers {m.get('transformers')}, "
                  f"git {res.get('git')}", ""]
        if res.get("combined_from"):                 # diag bench combine: which run gave which sections
            lines += ["combined from: " + "; ".join(f"{r['file']} (git {str(r.get('git'))[:7]}, {r.get('started')}): "
                                                    f"{', '.join(r['sections'])}" for r in res["combined_from"]), ""]
        goals = goal_lines(res)
        if goals:
            lines += ["| goal | measured | target | |", "|---|---|---|---|", *goals, ""]
        for name, sec in res["sections"].items():
            lines += _section_lines(name, sec)
        lines.append("")
    return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
