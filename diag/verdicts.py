"""Verdicts: sentences a ticket can quote, each with its evidence and interval.

Layout (DESIGN.md §10): the trained layout is the best candidate by trajectory accept length
on the reference regime and the primary tree (the case's first); candidates whose paired
bootstrap difference to the best has a 95% interval reaching zero are "indistinguishable
from the best". The serving layout is a mismatch when it is not in that set: it is lower
and the interval of (best - serving) excludes zero.
EAGLE: under --speculative-algorithm EAGLE the drafter sees the final-normed last state.

This module reads the plain dicts results.py made; it knows nothing about models or files.
"""

from __future__ import annotations

from diag.stats import paired_bootstrap_diff


def _primary(evals: list[dict], case) -> list[dict]:
    tree = evals[0]["tree"] if evals else None
    from diag.trees import tree_shape
    if case.evaluate.trees:
        tree = tree_shape(case.evaluate.trees[0]).name
    ref = case.evaluate.reference_regime
    return [e for e in evals if e["tree"] == tree and e["regime"] == ref and e["tokens_regime"] == ref]


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _role_of(run, label: str) -> list[str]:
    for c in run.candidates:
        if c.label == label:
            return c.roles
    return []


def layout_verdicts(run) -> list[dict]:
    evals = [e for e in _primary(run.evaluations, run.case) if e["mode"] == "eagle3" and e["accept_length"]]
    if not evals:
        return []
    seed, n = run.case.evaluate.seed, run.case.evaluate.bootstrap
    ranked = sorted(evals, key=lambda e: -e["accept_length"])
    best = ranked[0]
    ties = []
    for e in ranked:
        d, lo, hi = paired_bootstrap_diff(best["trajectory_rounds"], e["trajectory_rounds"], seed=seed, n=n)
        e_diff = {"layout": e["layout"], "accept_length": e["accept_length"], "diff_to_best": d,
                  "ci95": [lo, hi], "roles": _role_of(run, e["layout"])}
        if lo <= 0.0:
            ties.append(e_diff)
        e["_diff"] = e_diff
    out = [_trained_verdict(best, ties, ranked, run)]
    serving = [e for e in evals if any(r == "serving" for r in _role_of(run, e["layout"]))]
    if serving:
        out.append(_serving_verdict(best, serving[0], ties, run))
    for e in evals:
        e.pop("_diff", None)
    return out


def _trained_verdict(best, ties, ranked, run) -> dict:
    prompts = run.prompts["count"]
    lo, hi = best["accept_length_ci95"]
    measured = f"{_fmt(best['accept_length'])} (95% CI {_fmt(lo)}-{_fmt(hi)}) on {best['tree']}"
    others = [t["layout"] for t in ties if t["layout"] != best["layout"]]
    if len(ranked) == 1:
        text = (f"Only layout {best['layout']} was evaluated: accept length {measured}. Add layouts or "
                f"scan = true to test which layout the drafter was trained on.")
    else:
        tie_text = (f" Statistically indistinguishable from it (paired bootstrap over {prompts} prompts): "
                    f"{', '.join(others)}." if others else
                    f" Every other candidate is lower, with 95% intervals over {prompts} prompts excluding zero.")
        text = (f"The drafter was trained on layout {best['layout']}: it gives the highest accept length, "
                f"{measured}, among {len(ranked)} candidate layouts.{tie_text}")
    return {"kind": "trained-layout", "severity": "info", "text": text,
            "evidence": {"best": best["layout"], "accept_length": best["accept_length"],
                         "ci95": best["accept_length_ci95"], "indistinguishable": ties,
                         "ranking": [(e["layout"], e["accept_length"]) for e in ranked]}}


def _serving_verdict(best, serving, ties, run) -> dict:
    seed, n = run.case.evaluate.seed, run.case.evaluate.bootstrap
    d, lo, hi = paired_bootstrap_diff(best["trajectory_rounds"], serving["trajectory_rounds"], seed=seed, n=n)
    in_ties = any(t["layout"] == serving["layout"] for t in ties)
    evidence = {"serving": serving["layout"], "trained": best["layout"], "serving_accept_length":
                serving["accept_length"], "trained_accept_length": best["accept_length"],
                "difference": d, "ci95": [lo, hi], "prompts": run.prompts["count"]}
    if in_ties:
        text = (f"The serving layout {serving['layout']} matches the trained layout: accept length "
                f"{_fmt(serving['accept_length'])} vs best {_fmt(best['accept_length'])} "
                f"(difference {d:+.2f}, 95% CI [{lo:+.2f}, {hi:+.2f}] includes zero).")
        return {"kind": "layout-match", "severity": "ok", "text": text, "evidence": evidence}
    text = (f"LAYOUT MISMATCH: the server feeds the drafter {serving['layout']}, but it was trained on "
            f"{best['layout']}. Accept length {_fmt(serving['accept_length'])} served vs "
            f"{_fmt(best['accept_length'])} trained on {best['tree']} (difference {d:+.2f}, "
            f"95% CI [{lo:+.2f}, {hi:+.2f}] over {run.prompts['count']} prompts).")
    return {"kind": "layout-mismatch", "severity": "error", "text": text, "evidence": evidence}


def eagle_verdicts(run) -> list[dict]:
    out = []
    for e in _primary(run.evaluations, run.case):
        if e["mode"] != "eagle":
            continue
        serving_mode = run.case.serving.algorithm.upper() in ("EAGLE", "NEXTN")
        text = (f"{'SERVED WITH' if serving_mode else 'If served with'} --speculative-algorithm EAGLE, "
                f"accept length is {_fmt(e['accept_length'])} on {e['tree']}: the server feeds the drafter "
                f"only the final-normed last hidden state (width {run.target.hidden_size} instead of "
                f"{run.drafter['num_aux']} x {run.target.hidden_size}), skips its fc when the widths match, "
                f"uses the target's lm_head and ignores d2t. Use --speculative-algorithm EAGLE3.")
        sev = "error" if serving_mode else "warning"
        out.append({"kind": "eagle-algorithm", "severity": sev, "text": text,
                    "evidence": {"accept_length": e["accept_length"], "ci95": e["accept_length_ci95"]}})
    return out


def _best_layout(run) -> str | None:
    evals = [e for e in _primary(run.evaluations, run.case) if e["mode"] == "eagle3" and e["accept_length"]]
    return max(evals, key=lambda e: e["accept_length"])["layout"] if evals else None


def _likely_trained(run, layout_vs: list[dict]) -> str | None:
    """The layout to recommend: among those indistinguishable from the best, one the
    drafter's config declares or whose ids some convention reads (adjacent layers can tie,
    DESIGN.md §10; the config then breaks the tie); else the best itself."""
    trained = next((v for v in layout_vs if v["kind"] == "trained-layout"), None)
    best = _best_layout(run)
    if trained is None:
        return best
    for t in trained["evidence"]["indistinguishable"]:
        if any(r.startswith(("declared", "reading")) for r in t["roles"]):
            return t["layout"]
    return best


def speedup_verdicts(run) -> list[dict]:
    """The best tree shape for the trained layout at the run's step costs, and whether
    speculation pays at all (its break-even accept length)."""
    sp, lay = run.speedup, _best_layout(run)
    if not sp or lay is None:
        return []
    ref = run.case.evaluate.reference_regime
    rows = [r for r in sp["rows"] if r["layout"] == lay and r["mode"] == "eagle3" and r["regime"] == ref
            and r["tokens_regime"] == ref and r.get("speedup") is not None]
    if not rows:
        return []
    best = max(rows, key=lambda r: r["speedup"])
    ev = {"layout": lay, "best": best, "costs": sp["costs"], "costs_source": sp["source"],
          "shapes": [(r["tree"], r["accept_length"], r["speedup"], r["break_even_accept_length"]) for r in rows]}
    core = (f"{best['tree']} (S={best['num_steps']}, K={best['topk']}, D={best['num_draft_tokens']}) on "
            f"{lay}: accept length {_fmt(best['accept_length'])}, break-even "
            f"{_fmt(best['break_even_accept_length'])}, predicted {best['speedup']:.2f}x plain decoding "
            f"(costs {sp['source']}).")
    if best["speedup"] < 1.0:
        text = (f"SPECULATION DOES NOT PAY at these step costs: even the best of {len(rows)} shapes, {core} "
                f"Every shape needs a higher accept length than the drafter reaches.")
        return [{"kind": "speedup", "severity": "warning", "text": text, "evidence": ev}]
    return [{"kind": "tree-choice", "severity": "info",
             "text": f"Best tree shape of {len(rows)} evaluated: {core}", "evidence": ev}]


def _worst_drift(row: dict, layout: str) -> tuple[str, dict]:
    pts = [p for p in layout.split("+") if p in row["drift"]] or list(row["drift"])
    worst = min(pts, key=lambda p: row["drift"][p]["cosine"])
    return worst, row["drift"][worst]


def _cross(sec: dict, feats: str, toks: str):
    for c in sec["cross"]:
        if c["features"] == feats and c["tokens"] == toks:
            return c["accept_length"]
    return None


def regime_verdicts(run) -> list[dict]:
    """Per regime: accept length against the reference, with the interval; where it moved
    (the drifted capture points); and, with the cross matrix, whether the drafter's inputs
    or the target's answers moved."""
    sec = run.regimes
    if not sec:
        return []
    ref, lay, out = sec["reference"], sec["layout"], []
    for row in sec["regimes"]:
        if row["regime"] == ref or "vs_reference" not in row:
            continue
        d, (lo, hi) = row["vs_reference"]["difference"], row["vs_reference"]["ci95"]
        point, dr = _worst_drift(row, lay)
        text = (f"Regime {row['regime']} vs {ref}: accept length {_fmt(row['accept_length'])} vs "
                f"{_fmt(_cross(sec, ref, ref))} on {lay}, {sec['tree']} (difference {d:+.2f}, 95% CI "
                f"[{lo:+.2f}, {hi:+.2f}]); greedy tokens agree at {row['argmax_agreement']:.1%} of positions; "
                f"largest drift of the layout's points at {point} (cosine {dr['cosine']:.4f}, relative L2 "
                f"{dr['relative_l2']:.3f}).")
        inputs, answers = _cross(sec, row["regime"], ref), _cross(sec, ref, row["regime"])
        if inputs is not None and answers is not None:
            text += (f" Cross matrix: drafter inputs from {row['regime']} with {ref}'s tokens give "
                     f"{_fmt(inputs)} (the inputs moved); {ref}'s inputs with {row['regime']}'s tokens give "
                     f"{_fmt(answers)} (the answers moved).")
        sev = "warning" if hi < 0 else "info"
        out.append({"kind": "quantization", "severity": sev, "text": text, "evidence": row})
    return out


def serving_error_verdicts(run, layout_vs: list[dict]) -> list[dict]:
    """The engine cannot serve the drafter as configured (e.g. layer ids it cannot capture)."""
    errors = [n[len("serving error: "):] for n in run.notes if n.startswith("serving error: ")]
    if not errors:
        return []
    best = _likely_trained(run, layout_vs)
    fix = ""
    if best is not None:
        from diag import conventions
        from diag.layouts import layout
        fam = "sglang-deepseek" if run.target.family == "deepseek" else "sglang-llama"
        ids = conventions.to_ids(layout(best), fam, run.target.num_layers)
        fix = (f" The drafter was trained on {best}; write eagle_config.eagle_aux_hidden_state_layer_ids = "
               f"{ids} for {fam}." if ids is not None else
               f" The drafter was trained on {best}, which {fam} cannot capture.")
    text = f"SERVING ERROR: {run.case.serving.engine} cannot serve this drafter as configured: {errors[0]}.{fix}"
    return [{"kind": "serving-error", "severity": "error", "text": text, "evidence": {"errors": errors,
                                                                                     "trained": best}}]


def verdicts(run) -> list[dict]:
    """All verdicts, most severe first."""
    order = {"error": 0, "warning": 1, "ok": 2, "info": 3}
    layout = layout_verdicts(run)
    found = (serving_error_verdicts(run, layout) + layout + eagle_verdicts(run) + regime_verdicts(run)
             + speedup_verdicts(run))
    return sorted(found, key=lambda v: order[v["severity"]])
