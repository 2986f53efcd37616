"""report.md's "Greedy vs sampled acceptance" section: per layout, mode and tree, the greedy
accept length beside each sampled decoding's Monte-Carlo and exact accept lengths, with
per-depth acceptance P(a >= d) (DESIGN.md §11). Rendered from report.json only.

Worked example row: `embed+L2+L4` eagle3 chain-3 | greedy 2.31 | Monte-Carlo 1.48 (1.41-1.55)
| exact 1.47 (1.42-1.52) | P(a>=d) greedy .71 .39 .21 | sampled .32 .11 .04 | exact .31 .11 .04.
This module reads the report dict; it computes nothing new.
"""

from __future__ import annotations

from diag.engines import engine, rules


def _f(x, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _ci(lo, hi) -> str:
    return "" if lo is None else f" ({_f(lo)}–{_f(hi)})"


def _depth(xs) -> str:
    return " ".join(_f(x) for x in xs) if xs else "–"


def _greedy_twin(rep: dict, e: dict) -> dict | None:
    return next((g for g in rep["evaluations"] if g.get("decoding", "greedy") == "greedy"
                 and all(g[k] == e[k] for k in ("layout", "mode", "tree", "regime", "tokens_regime"))), None)


def _sampled_rule(rep: dict) -> str:
    """The served engine's sampled verification, as the header names it: "SGLang's target-only rule"
    (EngineRules.verification: "tree-target-only"), "vLLM's chain-rejection rule"."""
    rel = engine((rep.get("serving") or {}).get("engine"))
    return f"{rel.display}'s {rules(rel).verification(rel).sampled.removeprefix('tree-')} rule"


def _header(rep: dict) -> list[str]:
    dec = rep["decoding"]
    served = dec["served"]
    out = [f"The server decodes with **{served['name']}** ({dec['source']}); verdicts use it. Sampled "
           f"decodings ran the speculative decode loop (one tree-attention verify forward per round, "
           f"{_sampled_rule(rep)}) once per seed ({', '.join(map(str, dec['seeds']))}) over every prompt; "
           "Monte-Carlo = 1 + mean accepted drafts, exact = 1 + mean over the same rounds of E[accepted | round] "
           "(the verdicts rank by it); 95% intervals over prompts, seeds pooled."]
    for d in dec["sampled"]:
        if d["lossy"]:
            out.append(f"**Lossy verification** under {d['name']}: accept thresholds single "
                       f"{d['threshold_single']}, acc {d['threshold_acc']} (below 1) accept drafts the target "
                       "would not emit; the output no longer follows the target distribution.")
    return out


def decoding_lines(rep: dict) -> list[str]:
    sampled = [e for e in rep["evaluations"] if e.get("decoding", "greedy") != "greedy"]
    if not sampled:
        return []
    out = ["## Greedy vs sampled acceptance", "", *_header(rep), "",
           "| layout | mode | tree | decoding | greedy | Monte-Carlo (95% CI) | exact (95% CI) | rounds | "
           "P(a≥d) greedy | P(a≥d) sampled | P(a≥d) exact |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in sorted(sampled, key=lambda e: (e["decoding"], e["tree"], -(e["expected_accept_length"] or 0))):
        g = _greedy_twin(rep, e)
        lo, hi = e["accept_length_ci95"]
        elo, ehi = e["expected_accept_length_ci95"]
        out.append(f"| `{e['layout']}` | {e['mode']} | {e['tree']} | {e['decoding']} | "
                   f"{_f(g['accept_length']) if g else '–'} | {_f(e['accept_length'])}{_ci(lo, hi)} | "
                   f"**{_f(e['expected_accept_length'])}**{_ci(elo, ehi)} | {e['trajectory']['rounds']} | "
                   f"{_depth(g['trajectory']['acceptance_at_depth']) if g else '–'} | "
                   f"{_depth(e['trajectory']['acceptance_at_depth'])} | {_depth(e['expected_acceptance_at_depth'])} |")
    return out + [""]
