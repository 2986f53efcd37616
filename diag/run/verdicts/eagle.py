"""The EAGLE-mode verdict: what the drafter gets under `--speculative-algorithm EAGLE` (or
its alias NEXTN), where the server feeds only the final-normed last hidden state.

Reads Evaluation records; knows nothing about models or files.
"""

from __future__ import annotations

from diag.engines import rules
from diag.replay.evaluation import select
from diag.run.verdicts.layout import under
from diag.run.verdicts.record import Verdict, fmt


def eagle_verdicts(run) -> list[Verdict]:
    served_eagle = rules(run.case.serving.engine).mode_of(run.case.serving.algorithm) == "eagle"
    out = []
    for e in select(run.evaluations, run.reference, mode="eagle"):
        text = (f"{'SERVED WITH' if served_eagle else 'If served with'} --speculative-algorithm EAGLE, "
                f"accept length is {fmt(e.judged_accept_length)} on {e.tree}{under(e)}: the server feeds the drafter "
                f"only the final-normed last hidden state (width {run.target.hidden_size} instead of "
                f"{run.drafter['num_aux']} x {run.target.hidden_size}), skips its fc when the widths match, "
                f"uses the target's lm_head and ignores d2t. Use --speculative-algorithm EAGLE3.")
        out.append(Verdict("eagle-algorithm", "error" if served_eagle else "warning", text,
                           {"accept_length": e.judged_accept_length, "ci95": list(e.judged_ci95),
                            "decoding": e.decoding}))
    return out
