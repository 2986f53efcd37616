"""report.md: verdicts first, then what was run, then tables; rendered from report.json only.

A reader who never ran diag must see what is wrong in the first lines, and exactly what was
run below it. This module reads the report dict; it computes nothing new.
"""

from __future__ import annotations

from diag.report.server_markdown import server_markdown
from diag.report.prompt_side_md import prompt_side
from diag.report.decoding_section import decoding_lines

_ICON = {"error": "❌", "warning": "⚠️", "ok": "✅", "info": "ℹ️"}


def _f(x, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _verdicts(rep: dict) -> list[str]:
    out = ["## Verdicts", ""]
    if not rep["verdicts"]:
        out.append("No verdict: no candidate produced verify rounds.")
    for v in rep["verdicts"]:
        out.append(f"- {_ICON[v['severity']]} **{v['severity'].upper()}** — {v['text']}")
    return out + [""]


def _drafter_line(d: dict) -> str:
    """e.g. "- drafter `D`: sglang-eagle3 Eagle3DeepseekV2ForCausalLM (mla attention, eagle3.1:
    fc_norm, norm_output; lm_head from the target; trainer torchspec), fc takes 3 points, ..."."""
    opts = d.get("options") or {}
    flags = [k for k in ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual", "qk_norm")
             if opts.get(k)]
    head = "lm_head from the target" if opts.get("lm_head") == "target" else "own lm_head"
    what = ", ".join([f"{d.get('variant', 'eagle3')}" + (f": {', '.join(flags)}" if flags else ""), head,
                      f"trainer {d.get('trainer', 'unknown')}"])
    return (f"- drafter `{d['path']}`: {d['format']} {d.get('architecture', '')} ({d.get('attention', 'llama')} "
            f"attention; {what}), fc takes {d['num_aux']} points, draft vocab {d['draft_vocab_size']}, "
            f"config hash `{d['config']}`")


def _what_ran(rep: dict) -> list[str]:
    p, t, d, tp = rep["provenance"], rep["target"], rep["drafter"], rep["target_pass"]
    m = p["machine"]
    gpus = ", ".join(m["gpus"]) or "none (CPU)"
    cached = ", ".join(f"{r}: {'cached' if x['cached'] else 'computed'}" for r, x in tp["regimes"].items())
    return ["## What was run", "",
            f"- diag {p['diag_version']} (git `{p['git']}`), command: `{' '.join(p['command'])}`",
            f"- torch {m['torch']}, transformers {m['transformers']}, CUDA {m['cuda']}, GPUs: {gpus}",
            f"- case `{rep['case']['name']}` from `{rep['case']['source']}` (hash `{rep['case']['hash']}`)",
            f"- target `{t['path']}`: {t['architecture']}, {t['num_layers']} layers, hidden {t['hidden_size']}, "
            f"vocab {t['vocab_size']}, quantization {t['quantization'] or 'none'}, config hash `{t['config_hash']}`",
            _drafter_line(d),
            _serving_line(rep),
            f"- prompts `{rep['prompts']['file']}`: {rep['prompts']['count']} prompts "
            f"({', '.join(rep['prompts']['categories'])}), hash `{rep['prompts']['sha256']}`, rendered as "
            f"`{(rep.get('reference') or {}).get('rendering') or 'auto'}`",
            f"- target pass: {tp['source']} continuations, max_new_tokens {tp['max_new_tokens']}, "
            f"{tp['sequences']} sequences, {tp['tokens']} tokens ({tp['continuation_tokens']} continuation); "
            f"captured {', '.join(tp['points'])}; {cached}",
            "- timings: " + ", ".join(f"{k} {v}" for k, v in rep["timings"].items()), ""]


def _serving_line(rep: dict) -> str:
    """The serving configuration the case describes and the layout diag resolved it to."""
    sv = rep["case"]["spec"]["serving"]
    served = [c["label"] for c in rep["candidates"] if "serving" in c["roles"]]
    return (f"- serving: {sv['engine']}, --speculative-algorithm {sv['algorithm']}, feeds "
            f"{', '.join(f'`{s}`' for s in served) or 'an unresolved layout'}"
            + (" (set in the case)" if sv.get("layout") else " (resolved from the drafter config)"))


def _candidates(rep: dict) -> list[str]:
    out = ["## Candidate layouts", "", "| layout | mode | why it was evaluated |", "|---|---|---|"]
    for c in rep["candidates"]:
        out.append(f"| `{c['label']}` | {c['mode']} | {'; '.join(c['roles'])} |")
    return out + [""]


def _served(rep: dict) -> list[dict]:
    """The evaluations under the serving rendering (the others are the renderings section's)."""
    served = (rep.get("reference") or {}).get("rendering")
    return [e for e in rep["evaluations"] if served is None or e.get("rendering", served) == served]


def _table(rep: dict) -> list[str]:
    out = ["## Acceptance", "",
           "accept length = 1 + mean accepted drafts per verify round (bonus token included), over the "
           "rounds a real decode visits (trajectory); 95% CI by bootstrap over prompts. "
           "`all pos.` = over every position of the continuation.", "",
           "| layout | mode | tree | regime | accept length | 95% CI | all pos. | no bonus | sglang rate | "
           "legacy rate | P(a≥d), d=1.. |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    served = [e for e in _served(rep) if e.get("decoding", "greedy") == "greedy"]   # sampled: own section
    for e in sorted(served, key=lambda e: (e["tree"], -(e["accept_length"] or 0))):
        tr, al = e["trajectory"], e["all_positions"]
        depth = " ".join(_f(x) for x in al["acceptance_at_depth"])
        lo, hi = e["accept_length_ci95"]
        reg = e["regime"] if e["regime"] == e["tokens_regime"] else f"{e['regime']}→{e['tokens_regime']}"
        out.append(f"| `{e['layout']}` | {e['mode']} | {e['tree']} | {reg} | **{_f(e['accept_length'])}** | "
                   f"{_f(lo)}–{_f(hi)} | {_f(al['accept_length'])} | {_f(tr['accept_length_no_bonus'])} | "
                   f"{_f(tr['sglang_accept_rate'])} | {_f(tr['sglang_accept_rate_legacy'])} | {depth} |")
    return out + [""]


def _by_position(rep: dict) -> list[str]:
    out = ["## Acceptance by position in the sequence", "",
           "Falling acceptance at long positions points at RoPE or context-length mismatches.", ""]
    for e in _served(rep):
        if not e["by_position"]:
            continue
        cells = ", ".join(f"[{b['from']},{b['to']}): {_f(b['accept_length'])} ({b['rounds']} rounds)"
                          for b in e["by_position"])
        out.append(f"- `{e['key']}`: {cells}")
    return out + [""]


def _regimes(rep: dict) -> list[str]:
    sec = rep.get("regimes")
    if not sec:
        return []
    ref, points = sec["reference"], sec["points"]
    out = ["## Quantization regimes", "",
           f"Against `{ref}`, over the same sequences; accept length of `{sec['layout']}` on {sec['tree']}. "
           "Drift per capture point: mean cosine / relative L2.", "",
           "| regime | greedy agreement | accept length | vs reference [95% CI] | "
           + " | ".join(f"`{p}`" for p in points) + " |", "|---" * (4 + len(points)) + "|"]
    for r in sec["regimes"]:
        vs = r.get("vs_reference")
        vs_cell = f"{vs['difference']:+.2f} [{vs['ci95'][0]:+.2f}, {vs['ci95'][1]:+.2f}]" if vs else "–"
        cells = [f"{_f(r['drift'][p]['cosine'], 3)} / {_f(r['drift'][p]['relative_l2'], 3)}" for p in points]
        out.append(f"| {r['regime']} | {_f(r['argmax_agreement'], 3)} | {_f(r.get('accept_length'))} | "
                   f"{vs_cell} | " + " | ".join(cells) + " |")
    if sec.get("cross"):
        out += ["", "Cross matrix (features from one regime, verifying tokens from another): "
                + ", ".join(f"{c['features']}→{c['tokens']}: {_f(c['accept_length'])}" for c in sec["cross"])]
    return out + [""]


def _speedup(rep: dict) -> list[str]:
    sp = rep.get("speedup")
    if not sp or not sp.get("rows"):
        return []
    c = sp["costs"]
    verify = ", ".join(f"D={d}: {t * 1e3:.2f} ms" for d, t in c["t_verify"].items())
    out = ["## Will speculation pay?", "",
           f"Step costs ({sp['source']}): decode {c['t_decode'] * 1e3:.2f} ms, draft step "
           f"{c['t_draft'] * 1e3:.2f} ms, draft extend {c['t_draft_extend'] * 1e3:.2f} ms, verify {verify}. "
           "Break-even accept length = round cost / decode cost; above it speculation beats plain decoding."
           + _spread(sp), "",
           "| tree | layout | mode | regime | round cost | break-even | reachable | accept length | speedup |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(sp["rows"], key=lambda r: (r["tree"], -(r.get("speedup") or 0))):
        reg = r["regime"] if r["regime"] == r["tokens_regime"] else f"{r['regime']}→{r['tokens_regime']}"
        out.append(f"| {r['tree']} | `{r['layout']}` | {r['mode']} | {reg} | {r['round_cost_s'] * 1e3:.2f} ms | "
                   f"{'measurement error' if r.get('measurement_error') else _f(r['break_even_accept_length'])} | "
                   f"{'yes' if r['break_even_reachable'] else 'no'} | "
                   f"{_f(r.get('accept_length'))} | {_f(r.get('speedup'))}x |")
    return out + [""]


def _spread(sp: dict) -> str:
    """Measured costs: a measurement with its spread, never a verdict."""
    if sp.get("basis") != "measured" or not sp.get("spread"):
        return ""
    d = sp["spread"]["t_decode"]
    return (f" Measured on this machine, {sp['repeats']} calls each (decode {d['min'] * 1e3:.2f} / {d['median'] * 1e3:.2f}"
            f" / {d['max'] * 1e3:.2f} ms min / median / max): a measurement, not a verdict on your server. A "
            "break-even below 1 (a round cheaper than a plain step) is a measurement error.")


def _plots(rep: dict) -> list[str]:
    plots = rep.get("plots") or []
    if not plots:
        return []
    return ["## Plots", ""] + [f"![{p['title']}]({p['file']})" for p in plots] + [""]


def render(rep: dict) -> str:
    head = [f"# diag report: {rep['case']['name']}", ""]
    if rep["case"]["description"]:
        head += [rep["case"]["description"], ""]
    notes = ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""] if rep["notes"] else []
    body = (head + _verdicts(rep) + _what_ran(rep) + _candidates(rep) + _table(rep) + decoding_lines(rep)
            + _by_position(rep) + prompt_side(rep) + _regimes(rep) + _speedup(rep) + server_markdown(rep)
            + _plots(rep) + notes)
    return "\n".join(body) + "\n"
