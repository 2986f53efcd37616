"""The loops verdict: do repeated cycles in the continuations inflate the accept length?

When some verify rounds sit inside loops (loops.py): a warning when the paired 95% interval of
(accept length over all rounds - over the rounds outside loops) lies above zero, the headline
number then being partly the loops' doing; info otherwise. No verdict when nothing loops.
Reads the loops section; no models, no files.
"""

from __future__ import annotations

from diag.run.verdicts.record import Verdict, fmt


def loop_verdicts(run) -> list[Verdict]:
    sec = run.loops
    if not sec or not sec["in_loops"]["rounds"]:
        return []
    share = sec["in_loops"]["rounds"] / max(sec["all"]["rounds"], 1)
    diff = sec["difference"]
    ex = sec["examples"][0] if sec["examples"] else None
    core = (f"{share:.0%} of the verify rounds on {sec['layout']}, {sec['tree']} sit inside repeated cycles "
            f"(periods {', '.join(map(str, sec['periods']))}) in {sec['sequences_with_loops']} of "
            f"{sec['sequences']} continuations; accept length {fmt(sec['all']['accept_length'])} with them, "
            f"{fmt(sec['without_loops']['accept_length'])} without, {fmt(sec['in_loops']['accept_length'])} "
            f"inside loops")
    if ex:
        core += f" (e.g. prompt {ex['prompt']} cycles {ex['cycle']!r} from position {ex['from']})"
    if diff is not None and diff["ci95"][0] > 0:
        return [Verdict("loops", "warning", f"LOOPS INFLATE ACCEPT LENGTH: {core}; the loops add "
                        f"{diff['difference']:+.2f} (95% CI [{diff['ci95'][0]:+.2f}, {diff['ci95'][1]:+.2f}]). "
                        "Quote the number without loops, or use prompts whose continuations do not loop.", sec)]
    return [Verdict("loops", "info", core + ".", sec)]
