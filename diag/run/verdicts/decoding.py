"""Decoding verdicts (DESIGN.md §11): what the served decoding costs against greedy, and
whether its verification is lossy (an accept threshold below 1).

Reads Evaluation records at the run's reference axes (decoding = what the server runs) and
their greedy twins; knows nothing about models or files.
"""

from __future__ import annotations

from diag.replay.evaluation import one
from diag.run.evaluate import trained_lead
from diag.run.verdicts.record import Verdict, fmt


def _gap(run, top) -> Verdict:
    greedy = one(run.evaluations, top.axes.but(decoding="greedy"))
    lo, hi = top.expected_accept_length_ci95
    g = greedy.accept_length if greedy else None
    text = (f"Under the served decoding {top.decoding}, the trained layout {top.layout} reaches accept length "
            f"{fmt(top.expected_accept_length)} on {top.tree} (exact expectation, 95% CI {fmt(lo)}-{fmt(hi)}, "
            f"{len(top.seeds)} seeds; Monte-Carlo {fmt(top.accept_length)}) against {fmt(g)} greedy: "
            f"greedy numbers do not predict this server's accept length.")
    return Verdict("sampled-acceptance", "info", text,
                   {"decoding": top.decoding, "layout": top.layout, "tree": top.tree,
                    "expected_accept_length": top.expected_accept_length, "ci95": [lo, hi],
                    "monte_carlo_accept_length": top.accept_length, "greedy_accept_length": g,
                    "seeds": list(top.seeds)})


def decoding_verdicts(run) -> list[Verdict]:
    plan = getattr(run, "decoding", None)
    if plan is None or plan.served.greedy:
        return []
    out = []
    top = trained_lead(run.evaluations, run.reference, run.case, run.candidates)
    if top is not None:
        out.append(_gap(run, top))
    d = plan.served
    if d.lossy:
        out.append(Verdict("lossy-verification", "warning",
                           f"LOSSY VERIFICATION: the server accepts drafts with --speculative-accept-threshold-single "
                           f"{d.threshold_single} and --speculative-accept-threshold-acc {d.threshold_acc} (below 1): "
                           "it accepts drafts the target would not sample, so its output no longer follows the "
                           "target's distribution. Accept lengths above are for this lossy rule; set both to 1.0 "
                           "for lossless speculative decoding.", d.to_dict()))
    return out
