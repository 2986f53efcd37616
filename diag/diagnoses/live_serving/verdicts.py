"""The live-server verdicts: whether the engine's sampled runs are sane (their T -> 0 limit is its
greedy number: else ENGINE DEFECT, and no layout is fitted to them; these lead their severity),
which evaluated candidate explains what the server reported (or that none does, so the gap lies
in the engine), what the max_running_requests cap costs, and, last, whether speculation pays at
the costs calibrated from the server's own rates (calibrate.py).

Reads the typed section (section.ServerSection, parts.py; the reconciliation's matches keyed like
the evaluations) and the run's reference axes kept beside it; a verdict's evidence is the part it
rests on as report.json holds it (typed.to_json). Knows nothing about files.
Worked example of the calibrated verdict (the seed): 82.3 tok/s at accept length 2.20 on s3-k4-d5
against 90.0 plain (0.91x); a round costs 26.73 ms = 2.41 plain steps -> SPECULATION DOES NOT PAY
at your server's costs when no evaluated tree of the trained layout reaches 1x.
"""

from __future__ import annotations

from diag.diagnoses.live_serving.parts import Match
from diag.diagnoses.live_serving.section import ServerSection
from diag.diagnoses.typed import to_json
from diag.run.verdicts.record import Verdict, fmt


def _iv(lo, hi) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def _candidate(m: Match, ref_regime) -> str:
    a = m.axes
    regime = "" if a.get("regime") in (None, ref_regime) else f", regime {a['regime']}"
    return (f"`{a['layout']}` ({a['mode']}) on {a['tree']} (S={m.num_steps}, K={m.topk}, "
            f"D={m.num_draft_tokens}{regime})")


def _how(m: Match, mode: str) -> str:
    if mode == "per-request":
        lo, hi = m.per_request_rms_ci95
        return (f"diag {fmt(m.diag_value)} vs server {fmt(m.server_value)} on the same prompts, per-request "
                f"RMS difference {m.per_request_rms:.3f} [{lo:.3f}, {hi:.3f}]")
    lo, hi = m.difference_ci95
    return f"diag {fmt(m.diag_value)}, difference {m.difference:+.2f} {_iv(lo, hi)}"


def _rewrites(sec: ServerSection) -> str:
    rewrites = [n.removeprefix("launch command: ") for n in sec.observed.notes if "forces" in n]
    return f" (your launch flags were rewritten: {'; '.join(rewrites)})" if rewrites else ""


def _trained_sentence(sec: ServerSection, explaining: list[Match], server_tree: str | None, primary: str) -> str:
    lay = sec.trained_layout
    if lay is None or any(m.axes["layout"] == lay and m.axes["mode"] == "eagle3" for m in explaining):
        return ""
    rows = {t.tree: t for t in sec.trained}
    out = f" Not the trained `{lay}`."
    if server_tree in rows:
        t = rows[server_tree]
        out += f" On the server's {server_tree} the trained layout gives {fmt(t.accept_length)} {_iv(*t.accept_length_ci95)}."
    if primary in rows and primary != server_tree:
        t = rows[primary]
        out += (f" Serving the trained layout with the intended tree {primary} would give "
                f"{fmt(t.accept_length)} {_iv(*t.accept_length_ci95)}.")
    return out


def _config_sentence(served: tuple[str, ...], best: Match) -> str:
    """When the server runs another layout than the one its configuration resolves to."""
    if not served or best.axes["layout"] in served:
        return ""
    return (f" The configuration diag was given resolves to `{served[0]}`: the server is not running what its "
            "configuration says (check the drafter config it loaded, the launch command and the engine release).")


def _match_verdict(ref, served: tuple[str, ...], sec: ServerSection) -> list[Verdict]:
    rec = sec.reconciliation
    if rec is None:
        return []
    srv, mode = rec.server, rec.mode
    said = f"The server's accept length {fmt(srv.value)} {_iv(*srv.ci95)} ({srv.source})"
    explaining = [m for m in rec.matches if m.explains]
    ev = {"server": to_json(srv), "mode": mode, "explaining": to_json(rec.explaining), "closest": rec.closest,
          "trained_layout": sec.trained_layout}
    tree = None if sec.observed.tree is None else sec.observed.tree.name
    if explaining:
        best = explaining[0]
        others = [m.key for m in explaining[1:]]
        text = (f"{said} matches {_candidate(best, ref.regime)}{_rewrites(sec)}: {_how(best, mode)}."
                + (f" Also consistent: {len(others)} other candidate(s) ({', '.join(others[:3])})." if others else "")
                + _trained_sentence(sec, explaining, best.axes["tree"], ref.tree)
                + _config_sentence(served, best))
        trained_ok = sec.trained_layout == best.axes["layout"] and best.axes["mode"] == "eagle3"
        return [Verdict("server-match", "ok" if trained_ok else "warning", text, {**ev, "best": to_json(best)})]
    closest = next((m for m in rec.matches if m.shape_ok), None)
    if closest is None:
        text = (f"{said} cannot be compared: the server ran {tree or 'another tree'}, which no evaluated tree "
                f"matches ({rec.matches[0].shape_reason}). Evaluate it too (--tree {tree}).")
        return [Verdict("server-unexplained", "warning", text, ev)]
    text = (f"No evaluated candidate explains the server's accept length {fmt(srv.value)} {_iv(*srv.ci95)} "
            f"({srv.source}): the closest, {_candidate(closest, ref.regime)}, "
            f"gives {_how(closest, mode)}. The drafter configurations diag varied do not account for the gap; it "
            "lies in the engine (prefix cache, kernels, tensor-parallel numerics), in sampling (temperature > 0), "
            "or in the continuation (replay the server's own outputs with --recorded).")
    return [Verdict("server-unexplained", "warning", text, {**ev, "closest_match": to_json(closest)})]


def _concurrency_verdict(sec: ServerSection) -> list[Verdict]:
    c = sec.concurrency
    if c is None:
        return []
    bound = 0 if c.log is None else c.log.lines_capped_with_queue
    if not c.capped and not bound:
        return []
    parts = []
    if c.capped:
        parts.append(f"at your concurrency {c.concurrency}, the speculative server runs only "
                     f"{c.max_running_requests} requests at a time (max_running_requests, {c.source}) and queues "
                     f"{c.concurrency - c.max_running_requests}: aggregate throughput at most "
                     f"{c.served_fraction:.0%} of what {c.concurrency} slots would give at the same per-request speed")
    if bound:
        parts.append(f"the log shows the cap binding in {bound} of {c.log.lines} decode lines (#running-req at "
                     f"{c.max_running_requests} with up to {c.log.max_queue_req} requests queued)")
    text = ("MAX RUNNING REQUESTS CAPS THROUGHPUT: " + "; ".join(parts)
            + f". Set --max-running-requests to your concurrency (memory permitting).")
    return [Verdict("server-concurrency", "warning", text, to_json(c))]


def sanity_verdicts(sec: ServerSection) -> list[Verdict]:
    """ENGINE DEFECT when the server's sampled runs do not approach its greedy number as T -> 0
    (diag/engines/sanity.py); the check's sentence when it passes or cannot be made."""
    check = sec.sanity
    if check is None:
        return []
    if check.verdict == "ENGINE DEFECT":
        return [Verdict("engine-defect", "error", check.message, to_json(check))]
    return [Verdict("engine-sanity", "ok" if check.verdict == "OK" else "info", check.message, to_json(check))]


def _fits_sampled(ref, v: Verdict) -> bool:
    """A match verdict that fits a layout to numbers the server produced by sampling."""
    return v.kind == "server-unexplained" or ref.decoding != "greedy"


def _range(pair, nd: int, unit: str) -> str:
    """[116.41, 126.5] -> "116.4-126.5 tok/s"; one number when both cost splits agree."""
    lo, hi = (f"{x:.{nd}f}" for x in pair)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def calibrated_verdicts(sec: ServerSection) -> list[Verdict]:
    """Will speculation pay at the server's own costs, for the trained layout and on which tree."""
    cal = sec.speedup
    if cal is None:
        return []
    c = cal.costs
    said = (f"Your server: {cal.tokens_per_second:.1f} tok/s at accept length {fmt(cal.accept_length)} on "
            f"{c.shape} against {cal.baseline_tokens_per_second:.1f} tok/s plain ({cal.measured_speedup:.2f}x); "
            f"a round costs {c.round_s * 1e3:.2f} ms = {c.break_even_accept_length:.2f} plain steps, the "
            f"break-even accept length on {c.shape}.")
    by_key = {r.key: r for r in cal.rows}
    rows = [by_key[k] for k in sec.trained_keys if k in by_key]
    if not rows:
        return [Verdict("speedup", "info", said, {"calibration": to_json(c)})]
    top = max(rows, key=lambda r: r.speedup[1])
    lo, hi = top.speedup
    shape = (f"{top.tree} on {sec.trained_layout}: accept length {fmt(top.accept_length)}, "
             f"{_range(top.tokens_per_second, 1, ' tok/s')}, {_range(top.speedup, 2, 'x')}")
    ev = {"calibration": to_json(c), "best": to_json(top), "rows": to_json(rows)}
    if hi < 1.0:
        return [Verdict("speedup", "warning", f"SPECULATION DOES NOT PAY at your server's costs: {said} Even the best "
                        f"of {len(rows)} evaluated trees, {shape}, stays below plain decoding.", ev)]
    if lo > 1.0:
        return [Verdict("tree-choice", "info", f"{said} At these costs the best of {len(rows)} evaluated trees is "
                        f"{shape} plain decoding.", ev)]
    return [Verdict("speedup", "info", f"{said} The best of {len(rows)} evaluated trees, {shape}, may or may not "
                    "pay: one measured tree cannot split the round cost between drafting and verifying; measure a "
                    "second tree to decide.", ev)]


def server_verdicts(section: ServerSection) -> list[Verdict]:
    """The match and concurrency verdicts, then the calibrated speedup's."""
    ref = section.reference
    match = _match_verdict(ref, section.served, section)
    if section.sanity is not None and section.sanity.verdict == "ENGINE DEFECT":
        match = [v for v in match if not _fits_sampled(ref, v)]     # no layout explains a defect
    return match + _concurrency_verdict(section) + calibrated_verdicts(section)
