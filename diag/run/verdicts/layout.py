"""Layout verdicts (DESIGN.md §10): which layout the drafter was trained on, and whether the
server feeds it.

The trained layout is the best eagle3 candidate by trajectory accept length at the run's
reference axes (under a sampled decoding: by the exact per-round expectation, pooled over
seeds, DESIGN.md §11); candidates whose paired bootstrap difference to the best has a 95%
interval reaching zero are "indistinguishable from the best". Under sampling the verdict names,
of those, the one run/evaluate.trained_lead reads (the drafter's config's, else the first
candidate), so a batch's noise cannot swap two near-tied layouts between runs. The serving layout
is a mismatch when it is not in that set: it is lower and the interval of (best - serving)
excludes zero.
Reads Evaluation records and the run's candidates; knows nothing about models or files.
"""

from __future__ import annotations

from diag.engines import engine, rules
from diag.layouts import layout
from diag.replay.evaluation import select, tie_interval
from diag.run.candidates import config_reads
from diag.run.evaluate import trained_lead
from diag.run.verdicts.record import Verdict, fmt
from diag.stats import paired_bootstrap_diff


def roles_of(run, label: str) -> list[str]:
    return next((c.roles for c in run.candidates if c.label == label), [])


def ranked(run) -> list:
    """eagle3 layouts at the reference axes with rounds, best first."""
    pool = [e for e in select(run.evaluations, run.reference) if e.judged_accept_length]
    return sorted(pool, key=lambda e: -e.judged_accept_length)


def indistinguishable(run, order: list) -> list[dict]:
    """Every layout whose paired difference to the best has an interval reaching zero."""
    seed, n = run.case.evaluate.seed, run.case.evaluate.bootstrap
    top, ties = order[0], []
    for e in order:
        tied = tie_interval(top, e, seed=seed, n_boot=n)
        if tied is not None:
            d, lo, hi = tied
            ties.append({"layout": e.layout, "accept_length": e.judged_accept_length, "diff_to_best": d,
                         "ci95": [lo, hi], "roles": roles_of(run, e.layout)})
    return ties


def under(e) -> str:
    """" under t1.0-p0.95-k-1 (exact expectation, 3 seeds)" for a sampled evaluation, else ""."""
    return f" under {e.decoding} (exact expectation, {len(e.seeds)} seeds)" if e.sampled else ""


def _trained(top, ties: list[dict], order: list, run) -> Verdict:
    """top: the layout named (trained_lead); order[0]: the highest, another one only under sampling."""
    prompts = run.prompts["count"]
    lo, hi = top.judged_ci95
    measured = f"{fmt(top.judged_accept_length)} (95% CI {fmt(lo)}-{fmt(hi)}) on {top.tree}{under(top)}"
    others = [t["layout"] for t in ties if t["layout"] != top.layout]
    highest = order[0]
    if highest is top:
        claim = f"it gives the highest accept length, {measured}, among {len(order)} candidate layouts."
    else:
        why = ("the drafter's config reads it" if config_reads(roles_of(run, top.layout)) else
               "it comes first of them in the case's candidates")
        claim = (f"accept length {measured}, tied with the highest, {highest.layout} at "
                 f"{fmt(highest.judged_accept_length)}, among {len(order)} candidate layouts. Named rather than "
                 f"{highest.layout} because {why}: under sampling a best by a hair is noise a batch can move.")
    if len(order) == 1:
        text = (f"Only layout {top.layout} was evaluated: accept length {measured}. Add layouts or "
                f"scan = true to test which layout the drafter was trained on.")
    else:
        tie_text = (f" Statistically indistinguishable from it (paired bootstrap over {prompts} prompts"
                    f"{', seeds pooled: the interval cannot separate them' if top.sampled else ''}): "
                    f"{', '.join(others)}." if others else
                    f" Every other candidate is lower, with 95% intervals over {prompts} prompts excluding zero.")
        text = f"The drafter was trained on layout {top.layout}: {claim}{tie_text}"
    return Verdict("trained-layout", "info", text,
                   {"best": top.layout, "highest": highest.layout, "accept_length": top.judged_accept_length,
                    "ci95": list(top.judged_ci95),
                    "decoding": top.decoding, "indistinguishable": ties,
                    "ranking": [(e.layout, e.judged_accept_length) for e in order]})


def _fix(trained: str, run, target_config: dict | None) -> tuple[str, dict]:
    """The engine's fix for serving the trained layout (EngineRules.fix_for)."""
    if target_config is None or trained == "final (EAGLE)":
        return "", {}
    f = rules(run.case.serving.engine).fix_for(layout(trained), target_config, release=engine(run.case.serving.engine))
    upgrade = None if f.upgrade is None else {"version": f.upgrade[0], "ids": f.upgrade[1]}
    return f" Fix: {f.text}.", {"fix_ids": f.ids, "upgrade": upgrade, "engine": run.case.serving.engine}


def named(order: list, ties: list[dict]):
    """The evaluation a verdict names as trained: among the layouts indistinguishable from the
    best, the first (best first) that the drafter's config declares or whose ids a convention
    reads (DESIGN.md §10: adjacent layers tie, and the config breaks the tie); else the best.
    A scan of the demo's vLLM-id drafter (an earlier zoo): embed+L3+L4 2.83, embed+L2+L4 2.82
    (read by vllm's rule), tied -> embed+L2+L4."""
    read = next((t["layout"] for t in ties if config_reads(t["roles"])), None)
    return next((e for e in order if e.layout == read), order[0])


def _serving(top, serving, ties: list[dict], run, target_config: dict | None = None, best=None) -> Verdict:
    """best: the top-scoring evaluation where it is not `top` (the tie-broken one, named())."""
    seed, n = run.case.evaluate.seed, run.case.evaluate.bootstrap
    d, lo, hi = paired_bootstrap_diff(top.judged_rounds, serving.judged_rounds, seed=seed, n=n)
    nd = 3 if top.sampled else 2          # exact expectations resolve differences below 0.01
    evidence = {"serving": serving.layout, "trained": top.layout,
                "serving_accept_length": serving.judged_accept_length,
                "trained_accept_length": top.judged_accept_length, "difference": d, "ci95": [lo, hi],
                "prompts": run.prompts["count"], "decoding": top.decoding}
    if any(t["layout"] == serving.layout for t in ties):
        cannot = (" Under sampling this interval cannot separate the two layouts; greedy decoding or more "
                  "prompts and seeds can." if top.sampled and serving.layout != top.layout else "")
        text = (f"The serving layout {serving.layout} matches the trained layout: accept length "
                f"{fmt(serving.judged_accept_length)} vs best {fmt(top.judged_accept_length)}{under(top)} "
                f"(difference {d:+.{nd}f}, 95% CI [{lo:+.{nd}f}, {hi:+.{nd}f}] includes zero).{cannot}")
        return Verdict("layout-match", "ok", text, evidence)
    fix, more = _fix(top.layout, run, target_config)
    tie = ("" if best is None or best.layout == top.layout else
           f" (the layout its config's ids read, tied with the scan's best, {best.layout} at "
           f"{fmt(best.judged_accept_length)})")
    text = (f"LAYOUT MISMATCH: the server feeds the drafter {serving.layout}, but it was trained on "
            f"{top.layout}{tie}. Accept length {fmt(serving.judged_accept_length)} served vs "
            f"{fmt(top.judged_accept_length)} trained on {top.tree}{under(top)} (difference {d:+.{nd}f}, "
            f"95% CI [{lo:+.{nd}f}, {hi:+.{nd}f}] over {run.prompts['count']} prompts).{fix}")
    return Verdict("layout-mismatch", "error", text, {**evidence, **more})


def layout_verdicts(run, target_config: dict | None = None) -> list[Verdict]:
    """The trained-layout verdict and, when the server's layout is known, match or mismatch
    (with the engine's fix for the trained layout when the target config is given)."""
    order = ranked(run)
    if not order:
        return []
    ties = indistinguishable(run, order)
    top = trained_lead(run.evaluations, run.reference, run.case, run.candidates) if order[0].sampled else order[0]
    out = [_trained(top, ties, order, run)]
    serving = [e for e in order if "serving" in roles_of(run, e.layout)]
    if serving:
        out.append(_serving(top if top.sampled else named(order, ties), serving[0], ties, run, target_config,
                            best=order[0]))
    return out


def likely_trained(run, found: list[Verdict]) -> str | None:
    """The layout to recommend: among those indistinguishable from the best, one the
    drafter's config declares or whose ids some convention reads (adjacent layers can tie,
    DESIGN.md §10; the config then breaks the tie); else the best itself."""
    if any(v.kind == "drafter-predicts-nothing" for v in found):
        return None                      # a tie of zeros recommends nothing
    trained = next((v for v in found if v.kind == "trained-layout"), None)
    read = next((t["layout"] for t in trained.evidence["indistinguishable"] if config_reads(t["roles"])), None) \
        if trained is not None else None
    top = trained_lead(run.evaluations, run.reference, run.case, run.candidates)
    return read or (top.layout if top else None)
