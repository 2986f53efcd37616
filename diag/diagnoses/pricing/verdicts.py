"""The speedup verdicts: will speculation pay for the trained layout, and on which tree.

Only costs that speak for the user's server decide: costs calibrated from its measured rates
(a section offering `calibrated_speedup`, the live server's; its own verdicts then say it, and
these say nothing) or step costs the user gave (case [speedup], basis "user"). Costs diag
measured on this machine (basis "measured": batch 1, no CUDA graphs, no tensor parallelism, a
noisy shared CPU) never produce "SPECULATION DOES NOT PAY" nor a tree choice: two identical runs
measured 0.17x to 3.35x. They get one fixed sentence that says so, the same in every run.
Worked example (user costs: decode 11 ms, draft 1 ms, verify(4) 21.5 ms): chain-3 rounds cost
24.5 ms, break-even 2.23; at accept length 2.0 the prediction is 0.90x -> SPECULATION DOES NOT
PAY when no evaluated tree does better.
"""

from __future__ import annotations

from diag.diagnoses.pricing.section import SpeedupSection
from diag.diagnoses.typed import to_json
from diag.run.verdicts.record import Verdict, fmt

MEASURED = ("Speedup not judged: the step costs in the speedup section were measured by diag on this machine "
            "(batch 1, no CUDA graphs, no tensor parallelism) and say nothing about your server. Give its rates "
            "([server] baseline_tokens_per_second with a log or tokens_per_second) or its step costs ([speedup]) "
            "for a verdict.")


def _user_verdicts(sec: SpeedupSection) -> list[Verdict]:
    lay = sec.trained_layout
    rows = sec.trained_rows()
    if not rows:
        return []
    top = max(rows, key=lambda r: r.speedup)
    ev = {"layout": lay, "best": to_json(top), "costs": to_json(sec.costs), "costs_source": sec.source,
          "shapes": [(r.tree, r.accept_length, r.speedup, r.break_even_accept_length) for r in rows]}
    core = (f"{top.tree} (S={top.num_steps}, K={top.topk}, D={top.num_draft_tokens}) on "
            f"{lay}: accept length {fmt(top.accept_length)}, break-even "
            f"{fmt(top.break_even_accept_length)}, predicted {top.speedup:.2f}x plain decoding "
            f"(costs {sec.source}).")
    if top.speedup < 1.0:
        text = (f"SPECULATION DOES NOT PAY at these step costs: even the best of {len(rows)} shapes, {core} "
                f"Every shape needs a higher accept length than the drafter reaches.")
        return [Verdict("speedup", "warning", text, ev)]
    return [Verdict("tree-choice", "info", f"Best tree shape of {len(rows)} evaluated: {core}", ev)]


def speedup_verdicts(sec: SpeedupSection, others=None) -> list[Verdict]:
    if others is not None and others.get("calibrated_speedup"):
        return []                        # the server's own rates decide: its section says so
    if sec.basis == "user":
        return _user_verdicts(sec)
    return [Verdict("speedup", "info", MEASURED, {"costs_basis": sec.basis})]
