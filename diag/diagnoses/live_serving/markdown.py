"""report.md's "The live server" section, rendered from report.json's `server` entry only:
what the server reported, the candidates ranked by how well they explain it, the speedup
calibrated from its rates, what its running-request cap costs, and the benchmark settings
that reproduce diag's predicted acceptance on the server. Computes nothing new.
"""

from __future__ import annotations

from diag.diagnoses.live_serving.section import ServerSection
from diag.diagnoses.typed import to_json
from diag.engines import families, family_rules

SHOWN = 12      # candidate rows in the table; the rest are counted


def _f(x, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _iv(pair, nd: int = 2) -> str:
    return "–" if pair is None else f"[{_f(pair[0], nd)}, {_f(pair[1], nd)}]"


def _observed(sec: ServerSection) -> list[str]:
    o = sec.observed
    files = ", ".join(f"{f.kind} `{f.path}`" for f in o.files) or "none (values from the case)"
    out = [f"{o.engine}; read {files}.", ""]
    if o.accept_length:
        a = o.accept_length
        out.append(f"- accept length {_f(a.value)} {_iv(a.ci95)} ({a.source})")
    out += [f"- also: {_f(a.value)} {_iv(a.ci95)} ({a.source})" for a in o.also]
    if o.tree:
        t = o.tree
        out.append(f"- tree: {t.name} (S={t.num_steps}, K={t.topk}, D={t.num_draft_tokens}) from {t.source}")
    elif o.draft_tokens is not None:
        out.append(f"- num_draft_tokens consistent with every file: {list(o.draft_tokens[:8])}")
    if o.rate_formula:
        out.append(f"- the log's accept rate is `{o.rate_formula}` at this release")
    if o.tokens_per_second is not None:
        out.append(f"- speculative {_f(o.tokens_per_second, 1)} tok/s ({o.tokens_per_second_source})")
    if o.baseline_tokens_per_second is not None:
        out.append(f"- plain {_f(o.baseline_tokens_per_second, 1)} tok/s ({o.baseline_source})")
    if o.max_running_requests is not None:
        out.append(f"- max_running_requests {o.max_running_requests} ({o.max_running_requests_source})")
    out += [f"- sampled at T={r.temperature:g}: accept length {_f(r.accept_length)} "
            f"({r.rounds if r.rounds is not None else '?'} rounds, `{r.source}`)" for r in o.sampled]
    if sec.sanity:
        out.append(f"- engine sanity: **{sec.sanity.verdict}**: {sec.sanity.message}")
    return out + [f"- {n}" for n in o.notes] + [""]


def _matches(sec: ServerSection) -> list[str]:
    rec = sec.reconciliation
    if rec is None:
        return []
    per = rec.mode == "per-request"
    out = [f"Candidates ranked by how well they explain the server ({rec.mode}; best first):", "",
           "| candidate | tree | diag | server | diag − server [95% CI] | " + ("per-request RMS [95% CI] | " if per else "")
           + "tree allowed | explains |", "|---|---|---|---|---|" + ("---|" if per else "") + "---|---|"]
    for m in rec.matches[:SHOWN]:
        a = m.axes
        cells = [f"`{a['layout']}` {a['mode']}" + ("" if a["regime"] == "as-loaded" else f" {a['regime']}"), a["tree"],
                 _f(m.diag_value), _f(m.server_value), f"{m.difference:+.2f} {_iv(m.difference_ci95)}"]
        if per:
            cells.append(f"{_f(m.per_request_rms, 3)} {_iv(m.per_request_rms_ci95, 3)}")
        cells += ["yes" if m.shape_ok else f"no: {m.shape_reason}", "**yes**" if m.explains else "no"]
        out.append("| " + " | ".join(cells) + " |")
    if len(rec.matches) > SHOWN:
        out.append(f"\n({len(rec.matches) - SHOWN} more candidates in report.json)")
    return out + [""]


def _speedup(sec: ServerSection) -> list[str]:
    sp = sec.speedup
    if not sp:
        return []
    c = sp.costs
    out = [f"Speedup calibrated from the server: plain {_f(sp.baseline_tokens_per_second, 1)} tok/s, speculative "
           f"{_f(sp.tokens_per_second, 1)} tok/s at accept length {_f(sp.accept_length)} on {c.shape} "
           f"({_f(sp.measured_speedup)}x): a plain step costs {c.t_decode_s * 1e3:.2f} ms, a round "
           f"{c.round_s * 1e3:.2f} ms (break-even accept length {_f(c.break_even_accept_length)}). Other trees "
           f"are priced between all of the {c.overhead_s * 1e3:.2f} ms overhead in drafting "
           f"({c.t_draft_s_if_draft_bound * 1e3:.2f} ms per step) and all of it in verifying "
           f"({c.t_token_s_if_verify_bound * 1e3:.2f} ms per extra token).", "",
           "| tree | candidate | accept length | round cost (ms) | tok/s | speedup | break-even |", "|---|---|---|---|---|---|---|"]
    for r in sorted(sp.rows, key=lambda r: (r.tree, -r.tokens_per_second[1])):
        ms = [x * 1e3 for x in r.round_s]
        out.append(f"| {r.tree} | `{r.axes['layout']}` {r.axes['mode']} | {_f(r.accept_length)} | "
                   f"{_iv(ms)} | {_iv(r.tokens_per_second, 1)} | {_iv(r.speedup)} | "
                   f"{_iv(r.break_even_accept_length)} |")
    return out + [""]


def _concurrency(sec: ServerSection) -> list[str]:
    c = sec.concurrency
    if not c:
        return []
    line = f"Running-request cap: {c.max_running_requests} ({c.source})"
    if c.concurrency is not None:
        line += (f"; at concurrency {c.concurrency} it serves {c.served_fraction:.0%} of the requests at a time "
                 f"(throughput cost up to {c.throughput_cost:.0%})")
    if c.log:
        lg = c.log
        line += (f"; in the log #running-req peaked at {lg.max_running_req}, #queue-req at {lg.max_queue_req}, "
                 f"{lg.lines_capped_with_queue} of {lg.lines} lines at the cap with requests queued")
    return [line + ".", ""]


def _simulate(sec: ServerSection) -> list[str]:
    """The benchmark settings, each engine's part worded by that engine (EngineRules.simulation_cell,
    which reads the row as report.json holds it: its own keys among the others)."""
    if not sec.simulate:
        return []
    fams = [family_rules(f) for f in families()]
    out = [f"Benchmark the server at diag's predicted acceptance of `{sec.trained_layout}` "
           f"({'; '.join(f.simulation_legend() for f in fams)}):", ""]
    for s in sec.simulate:
        al = "–" if s.accept_length is None else f"{s.accept_length:.2f}"
        row = to_json(s)
        out.append(f"- {s.tree} (accept length {al}): " + "; ".join(f.simulation_cell(row) for f in fams)
                   + (f" ({'; '.join(s.notes)})" if s.notes else ""))
    return out + [""]


def markdown(sec: ServerSection) -> list[str]:
    return (["## The live server", ""] + _observed(sec) + _matches(sec) + _speedup(sec) + _concurrency(sec)
            + _simulate(sec))
