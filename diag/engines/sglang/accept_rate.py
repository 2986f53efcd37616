"""Which "accept rate" formula an SGLang version logs (DESIGN.md §6); the formulas themselves
are pure functions in diag.metrics.

The decode log line prints `accept len: L, accept rate: R`. L = completion tokens / verify
rounds = 1 + mean(a) in every version; R changed in 0.5.11:
  0.5.6–0.5.10.post1  sglang_accept_rate_legacy = Σ(a+1) / (rounds·D)   bonus counted
                      (managers/scheduler_metrics_mixin.py, observability/ since 0.5.10:
                       spec_num_accepted_tokens / (spec_num_forward_ct · num_draft_tokens))
  0.5.11–0.5.23       sglang_accept_rate = Σa / (rounds·(D−1))          draft slots only
                      (observability/scheduler_metrics_mixin.py, then
                       managers/scheduler_components/metrics_reporter.py since 0.5.13:
                       num_correct_drafts / (spec_num_forward_ct · (num_draft_tokens − 1)))
D is the server's speculative_num_draft_tokens after the topk=1 rewrite (S + 1 for chains).
Worked example: rounds 4, a = [1, 0, 2, 1], D = 4 -> legacy 8/16 = 0.50, new 4/12 = 0.33.

This module knows formula names and versions; nothing about logs or models.
"""

from __future__ import annotations

from diag.engines.common import ReportRate
from diag.engines.sglang.versions import Engine, Since, engine, since, span
from diag.metrics import bonus_accept_rate, draft_accept_rate

FORMULA: Since = (("0.5.6", "sglang_accept_rate_legacy"), ("0.5.11", "sglang_accept_rate"))
_TEXT = {"sglang_accept_rate_legacy": "Σ(a+1) / (rounds·D), bonus counted",
         "sglang_accept_rate": "Σa / (rounds·(D-1)), draft slots only"}


def formula_for(eng: Engine | str | None) -> str:
    """The metric name this version logs as "accept rate".
    Example: "sglang-0.5.10.post1" -> "sglang_accept_rate_legacy"."""
    return since(FORMULA, engine(eng))


def versions_of(formula: str) -> str:
    """The releases that log `formula`: "sglang_accept_rate" -> "0.5.11–0.5.23"."""
    return next(span(FORMULA, i) for i, (_, name) in enumerate(FORMULA) if name == formula)


def label(formula: str) -> str:
    """"SGLang 0.5.11–0.5.23: Σa / (rounds·(D-1)), draft slots only"."""
    return f"SGLang {versions_of(formula)}: {_TEXT[formula]}"


FORMULAS: dict[str, str] = {name: label(name) for _, name in FORMULA}

# both rates beside every accept length diag reports (report.json trajectory / all_positions /
# by_position fields, report.md columns), the current one first
REPORT_RATES = (ReportRate("sglang_accept_rate", draft_accept_rate, "sglang rate"),
                ReportRate("sglang_accept_rate_legacy", bonus_accept_rate, "legacy rate"))
