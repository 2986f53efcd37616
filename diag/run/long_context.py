"""Long context: acceptance against position, up to a length the user sets.

Prompts long enough to reach it are cut from one long text (the prompt set's texts joined, or
a text file): a ladder of `rungs` prompt lengths from a short one to `length - max_new_tokens`,
`per_rung` prompts per rung taken at different offsets of the text, each continued greedily by
the target. The continuation of a rung's prompts then sits at that rung's position.

    length 1024, max_new_tokens 64, rungs 4 -> prompt lengths [16, 320, 640, 960]
    (k * 960 / 3, at least MIN_PROMPT); 2 per rung at token offsets 0 and the text's middle

Per rung: the trajectory accept length on the trained layout and primary tree, with a
bootstrap interval over that rung's prompts, and the mean accepted drafts (accept length
minus the bonus token). A rung is marked when its mean accepted drafts fall below half of the
shortest rung's (the short-context value): accept length can never fall below 1, so halving
is judged without the bonus token. Worked example: short rung 3.0 (2.0 accepted drafts), a
rung at 2.0 (1.0 accepted) is not marked, one at 1.9 (0.9 < 1.0) is.

This module knows token ids, prompts and rounds; the target pass and the drafter replay that
feed it are the pipeline's.
"""

from __future__ import annotations

from pathlib import Path

from diag.errors import DiagError
from diag.stats import accept_length_ci

CATEGORY = "long-context"
MIN_PROMPT = 16
SEPARATOR = "\n\n"


def source_text(case, prompt_set) -> tuple[str, str]:
    """(text, where it came from): the case's file, else the prompt set's texts joined."""
    from diag.run.case import resolve_path
    lc = case.long_context
    if lc.file:
        path = Path(resolve_path(lc.file, case, "long_context.file"))
        if not path.is_file():
            raise DiagError("long-context text file not found", file=str(path), field="long_context.file",
                            expected="a text file", found="no such file")
        return path.read_text(), str(path)
    texts = [p.text if p.messages is None else SEPARATOR.join(c for _, c in p.messages) for p in prompt_set.prompts]
    return SEPARATOR.join(texts), prompt_set.path


def rung_lengths(length: int, max_new_tokens: int, rungs: int) -> list[int]:
    """Prompt lengths of the ladder (module docstring): [16, 320, 640, 960] for 1024, 64, 4."""
    top = length - max_new_tokens
    return [max(MIN_PROMPT, round(k * top / (rungs - 1))) for k in range(rungs)]


def ladder(tok, text: str, where: str, *, length: int, max_new_tokens: int, rungs: int,
           per_rung: int) -> list[tuple[str, str, list[int]]]:
    """(id "long-{L}-{q}", category, token ids) for every rung length L and prompt q."""
    ids = list(tok(text, add_special_tokens=False, verbose=False)["input_ids"])
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    lengths = rung_lengths(length, max_new_tokens, rungs)
    need = lengths[-1] - len(bos) + per_rung - 1
    if len(ids) < need:
        raise DiagError("long-context text too short for the ladder", file=where, field="long_context",
                        expected=f">= {need} tokens ({per_rung} prompts of up to {lengths[-1]} tokens)",
                        found=f"{len(ids)} tokens; give long_context.file or lower long_context.length")
    stride = (len(ids) - (lengths[-1] - len(bos))) // per_rung
    return [(f"long-{L}-{q}", CATEGORY, bos + ids[q * stride: q * stride + L - len(bos)])
            for L in lengths for q in range(per_rung)]


def rung_of(prompt_id: str) -> int:
    """"long-640-1" -> 640."""
    return int(prompt_id.split("-")[1])


def long_context_section(evaluation, *, length: int, source: str, seed: int, n_boot: int) -> dict:
    """Per rung acceptance of `evaluation` (the long-context prompts replayed), and the marks."""
    rungs: dict[int, list] = {}
    for p in evaluation.per_prompt:
        rungs.setdefault(rung_of(p.id), []).append(list(p.accepted))
    rows = []
    for start, rounds in sorted(rungs.items()):
        total = sum(len(r) for r in rounds)
        point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot) if total else (None, None, None)
        rows.append({"position": start, "prompts": len(rounds), "rounds": total, "accept_length": point,
                     "ci95": [lo, hi], "accepted_drafts": None if point is None else point - 1.0})
    short = rows[0]["accepted_drafts"] if rows else None
    for r in rows:
        r["below_half"] = bool(short and r["accepted_drafts"] is not None and r["accepted_drafts"] < short / 2)
    first = next((r["position"] for r in rows if r["below_half"]), None)
    return {"length": length, "source": source, "layout": evaluation.layout, "tree": evaluation.tree,
            "short_context": rows[0] if rows else None, "half_of_short": None if short is None else short / 2,
            "falls_below_half_at": first, "rungs": rows}
