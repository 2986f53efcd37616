"""What was run (versions, checkpoints, case, serving, prompts, target pass, timings), the
candidate layouts and why each was evaluated, and the run's notes."""

from __future__ import annotations

from diag.report.sections.cells import header, row


def what_ran(rep: dict) -> list[str]:
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
            drafter_line(d),
            serving_line(rep),
            f"- prompts `{rep['prompts']['file']}`: {rep['prompts']['count']} prompts "
            f"({', '.join(rep['prompts']['categories'])}), hash `{rep['prompts']['sha256']}`, rendered as "
            f"`{(rep.get('reference') or {}).get('rendering') or 'auto'}`",
            f"- target pass: {tp['source']} continuations, max_new_tokens {tp['max_new_tokens']}, "
            f"{tp['sequences']} sequences, {tp['tokens']} tokens ({tp['continuation_tokens']} continuation); "
            f"captured {', '.join(tp['points'])}; {cached}",
            "- timings: " + ", ".join(f"{k} {v}" for k, v in rep["timings"].items()), ""]


def drafter_line(d: dict) -> str:
    """e.g. "- drafter `D`: sglang-eagle3 Eagle3DeepseekV2ForCausalLM (mla attention; eagle3.1:
    fc_norm, norm_output, lm_head from the target, trainer torchspec), fc takes 3 points, ..."."""
    opts = d.get("options") or {}
    flags = [k for k in ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual", "qk_norm")
             if opts.get(k)]
    head = "lm_head from the target" if opts.get("lm_head") == "target" else "own lm_head"
    what = ", ".join([f"{d.get('variant', 'eagle3')}" + (f": {', '.join(flags)}" if flags else ""), head,
                      f"trainer {d.get('trainer', 'unknown')}"])
    return (f"- drafter `{d['path']}`: {d['format']} {d.get('architecture', '')} ({d.get('attention', 'llama')} "
            f"attention; {what}), fc takes {d['num_aux']} points, draft vocab {d['draft_vocab_size']}, "
            f"config hash `{d['config']}`")


def serving_line(rep: dict) -> str:
    """The serving configuration the case describes and the layout diag resolved it to."""
    sv = rep["case"]["spec"]["serving"]
    served = [c["label"] for c in rep["candidates"] if "serving" in c["roles"]]
    return (f"- serving: {sv['engine']}, --speculative-algorithm {sv['algorithm']}, feeds "
            f"{', '.join(f'`{s}`' for s in served) or 'an unresolved layout'}"
            + (" (set in the case)" if sv.get("layout") else " (resolved from the drafter config)"))


def candidates(rep: dict) -> list[str]:
    out = ["## Candidate layouts", "", *header(["layout", "mode", "why it was evaluated"])]
    for c in rep["candidates"]:
        out.append(row([f"`{c['label']}`", c["mode"], "; ".join(c["roles"])]))
    return out + [""]


def notes(rep: dict) -> list[str]:
    return ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""] if rep["notes"] else []
