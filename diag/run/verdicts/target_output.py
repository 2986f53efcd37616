"""The target-output verdict: the continuations the drafter is measured on are not language,
so the fault is the target's, not the drafter's (diag.target.output_health says how it is told).

  one token repeated (>= 50% of the continuation tokens)      -> error, always: acceptance on
      such text is meaningless whichever way it came out (a drafter may "accept" all of it)
  prompts predicted no better than a guess (cross-entropy >= 85% of log vocab) -> error when
      every candidate is at the accept-length floor (it replaces "drafter predicts nothing": an intact drafter
      cannot predict noise), a warning otherwise
An error here also silences the layout and EAGLE verdicts, as the floor verdict does.
Worked example: recorded continuations of 24 x token 17 -> "TARGET OUTPUT IS GARBAGE: one token
(id 17) makes 100% of the 144 continuation tokens ... The fault is the target's".

Reads run.target_output (an OutputHealth) and the case; no models, no files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict
from diag.target.output_health import UNIFORM_SHARE


def _text(run, h) -> str:
    what = []
    if h.repeated:
        what.append(f"one token (id {h.top_token}) makes {h.top_share:.0%} of the {h.tokens} continuation tokens")
    if h.uniform:
        what.append(f"the target predicts its own prompts no better than a uniform guess (cross-entropy "
                    f"{h.prompt_ce_share:.0%} of log(vocab_size) over {h.positions} prompt positions; a working "
                    f"model is far below {UNIFORM_SHARE:.0%})")
    recorded = run.case.prompts.recorded
    source = (f"the recorded continuations ({recorded})" if recorded else
              f"the target's own greedy continuations ({run.target.path})")
    return (f"TARGET OUTPUT IS GARBAGE: in {source}, {'; '.join(what)}. The fault is the target's "
            f"(its weights, its config.json, its dtype{', or the recording' if recorded else ''}), not the "
            "drafter's: accept lengths measured on these continuations say nothing about the drafter, "
            "so no layout verdict is given. Check the target first: a few greedy generations, "
            "`diag lint`, its config against its weights.")


def target_output_verdicts(run, at_floor: bool) -> list[Verdict]:
    h = getattr(run, "target_output", None)
    if h is None or not (h.repeated or h.uniform):
        return []
    severity = "error" if h.repeated or at_floor else "warning"
    return [Verdict("target-output-garbage", severity, _text(run, h), h.to_json())]
