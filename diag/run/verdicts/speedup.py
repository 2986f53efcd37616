"""The speedup verdicts: will speculation pay for the trained layout, and on which tree.

Only costs that speak for the user's server decide: costs calibrated from its measured rates
(the `server` section's speedup, run/calibrate.py) or step costs the user gave (case
[speedup], basis "user"). Costs diag measured on this machine (basis "measured": batch 1, no
CUDA graphs, no tensor parallelism, a noisy shared CPU) never produce "SPECULATION DOES NOT
PAY" nor a tree choice: two identical runs measured 0.17x to 3.35x. They get one fixed
sentence that says so, the same in every run.
"""

from __future__ import annotations

from diag.replay.evaluation import ANY, select
from diag.run.verdicts.record import Verdict, fmt


def _trained_rows(run, rows: list[dict]) -> list[dict]:
    lay = run.best_layout()
    if lay is None:
        return []
    by_key = {r["key"]: r for r in rows}
    return [by_key[e.key] for e in select(run.evaluations, run.reference, layout=lay, tree=ANY) if e.key in by_key]


def _user_verdicts(run, sp: dict) -> list[Verdict]:
    lay = run.best_layout()
    rows = [r for r in _trained_rows(run, sp["rows"]) if r.get("speedup") is not None]
    if not rows:
        return []
    top = max(rows, key=lambda r: r["speedup"])
    ev = {"layout": lay, "best": top, "costs": sp["costs"], "costs_source": sp["source"],
          "shapes": [(r["tree"], r["accept_length"], r["speedup"], r["break_even_accept_length"]) for r in rows]}
    core = (f"{top['tree']} (S={top['num_steps']}, K={top['topk']}, D={top['num_draft_tokens']}) on "
            f"{lay}: accept length {fmt(top['accept_length'])}, break-even "
            f"{fmt(top['break_even_accept_length'])}, predicted {top['speedup']:.2f}x plain decoding "
            f"(costs {sp['source']}).")
    if top["speedup"] < 1.0:
        text = (f"SPECULATION DOES NOT PAY at these step costs: even the best of {len(rows)} shapes, {core} "
                f"Every shape needs a higher accept length than the drafter reaches.")
        return [Verdict("speedup", "warning", text, ev)]
    return [Verdict("tree-choice", "info", f"Best tree shape of {len(rows)} evaluated: {core}", ev)]


def _range(pair, nd: int, unit: str) -> str:
    """[116.41, 126.5] -> "116.4-126.5 tok/s"; one number when both cost splits agree."""
    lo, hi = (f"{x:.{nd}f}" for x in pair)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _server_verdicts(run, cal: dict) -> list[Verdict]:
    c = cal["costs"]
    said = (f"Your server: {cal['tokens_per_second']:.1f} tok/s at accept length {fmt(cal['accept_length'])} on "
            f"{c['shape']} against {cal['baseline_tokens_per_second']:.1f} tok/s plain ({cal['measured_speedup']:.2f}x); "
            f"a round costs {c['round_s'] * 1e3:.2f} ms = {c['break_even_accept_length']:.2f} plain steps, the "
            f"break-even accept length on {c['shape']}.")
    rows = _trained_rows(run, cal["rows"])
    if not rows:
        return [Verdict("speedup", "info", said, {"calibration": c})]
    top = max(rows, key=lambda r: r["speedup"][1])
    lo, hi = top["speedup"]
    shape = (f"{top['tree']} on {run.best_layout()}: accept length {fmt(top['accept_length'])}, "
             f"{_range(top['tokens_per_second'], 1, ' tok/s')}, {_range(top['speedup'], 2, 'x')}")
    ev = {"calibration": c, "best": top, "rows": rows}
    if hi < 1.0:
        return [Verdict("speedup", "warning", f"SPECULATION DOES NOT PAY at your server's costs: {said} Even the best "
                        f"of {len(rows)} evaluated trees, {shape}, stays below plain decoding.", ev)]
    if lo > 1.0:
        return [Verdict("tree-choice", "info", f"{said} At these costs the best of {len(rows)} evaluated trees is "
                        f"{shape} plain decoding.", ev)]
    return [Verdict("speedup", "info", f"{said} The best of {len(rows)} evaluated trees, {shape}, may or may not "
                    "pay: one measured tree cannot split the round cost between drafting and verifying; measure a "
                    "second tree to decide.", ev)]


MEASURED = ("Speedup not judged: the step costs in the speedup section were measured by diag on this machine "
            "(batch 1, no CUDA graphs, no tensor parallelism) and say nothing about your server. Give its rates "
            "([server] baseline_tokens_per_second with a log or tokens_per_second) or its step costs ([speedup]) "
            "for a verdict.")


def speedup_verdicts(run) -> list[Verdict]:
    cal = (getattr(run, "server", None) or {}).get("speedup")
    if cal:
        return _server_verdicts(run, cal)
    sp = run.speedup
    if not sp:
        return []
    if sp.get("basis") == "user":
        return _user_verdicts(run, sp)
    return [Verdict("speedup", "info", MEASURED, {"costs_basis": sp.get("basis", "measured")})]
