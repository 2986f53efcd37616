"""Long context: acceptance against position, up to a length the user sets; the ladder of
prompts, the section, its verdict, Markdown and plot.

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

Needs from the target pass: the ladder's prompts (NEEDS_LONG_PROMPTS: run/inputs.py cuts them
with `ladder` below when the case's [long_context] sets a length, run/target_passes.py passes
them as the extra pass LONG_CONTEXT); this module replays the trained layout on that pass.

Verdict: a warning at the first rung whose mean accepted drafts are below half of the shortest
rung's; info with the curve otherwise. Plot long_context.png: accept length against prompt
length with 95% intervals, the half-of-short-context line (in accept-length units: 1 + half
the accepted drafts), marked rungs in red. Flags: --long-context, --long-context-file,
--long-context-rungs, --long-context-per-rung (add_flags). The case section [long_context] is
still parsed in run/case.py (its field of Case; tests/test_architecture.py lists it); this
module checks it (check_case).
This module knows token ids, prompts, rounds and the report's words; no files but the text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from diag.diagnoses.protocol import NEEDS_LONG_PROMPTS, Context, Diagnosis
from diag.diagnoses.typed import CI95, COUNT, TREE, meta, to_json
from diag.errors import DiagError
from diag.replay.evaluation import summarize
from diag.replay.replay import Variant
from diag.run.evaluate import cached_replay
from diag.report.sections.cells import ci, f
from diag.report.views import plot_link
from diag.run.target_passes import LONG_CONTEXT
from diag.run.verdicts.record import Verdict, fmt
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


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rung:
    position: int = meta(schema=COUNT)          # prompt length: where the continuation starts
    prompts: int = meta(schema={"minimum": 1})
    rounds: int = meta(schema=COUNT)
    accept_length: float | None = meta(schema={"minimum": 1})
    ci95: tuple[float | None, float | None] = meta(schema=CI95)
    accepted_drafts: float | None = meta(schema={"minimum": 0})   # accept length minus the bonus token
    below_half: bool = meta()


@dataclass(frozen=True)
class LongContextSection:
    length: int = meta(schema={"minimum": 1})
    source: str = meta()
    layout: str = meta()
    tree: str = meta(schema=TREE)
    short_context: Rung | None = meta()
    half_of_short: float | None = meta()
    falls_below_half_at: int | None = meta(schema={"minimum": 0})
    rungs: tuple[Rung, ...] = meta()


def long_context_section(evaluation, *, length: int, source: str, seed: int, n_boot: int) -> LongContextSection:
    """Per rung acceptance of `evaluation` (the long-context prompts replayed), and the marks."""
    rungs: dict[int, list] = {}
    for p in evaluation.per_prompt:
        rungs.setdefault(rung_of(p.id), []).append(list(p.accepted))
    rows = []
    for start, rounds in sorted(rungs.items()):
        total = sum(len(r) for r in rounds)
        point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot) if total else (None, None, None)
        rows.append((start, len(rounds), total, point, (lo, hi), None if point is None else point - 1.0))
    short = rows[0][5] if rows else None
    marked = tuple(Rung(*r, bool(short and r[5] is not None and r[5] < short / 2)) for r in rows)
    first = next((r.position for r in marked if r.below_half), None)
    return LongContextSection(length, source, evaluation.layout, evaluation.tree, marked[0] if marked else None,
                              None if short is None else short / 2, first, marked)


# ---- the diagnosis --------------------------------------------------------------------------

class LongContext(Diagnosis):
    name = "long_context"
    Section = LongContextSection
    needs = frozenset({NEEDS_LONG_PROMPTS})
    flag_of = {"long_context.length": "--long-context", "long_context.file": "--long-context-file",
               "long_context.rungs": "--long-context-rungs", "long_context.per_rung": "--long-context-per-rung"}

    def check_case(self, case) -> None:
        """[long_context]: a length of at least 2 x max_new_tokens, 2+ rungs, 1+ prompt per rung."""
        lc, src = case.long_context, case.source
        if lc.length and lc.length < 2 * case.prompts.max_new_tokens:
            raise DiagError("long-context length too short", file=src, field="long_context.length",
                            expected=f">= 2 x max_new_tokens = {2 * case.prompts.max_new_tokens}", found=lc.length)
        if lc.length and lc.rungs < 2:
            raise DiagError("long context needs at least 2 rungs", file=src, field="long_context.rungs",
                            expected=">= 2", found=lc.rungs)
        if lc.length and lc.per_rung < 1:
            raise DiagError("long context needs at least 1 prompt per rung", file=src,
                            field="long_context.per_rung", expected=">= 1", found=lc.per_rung)

    def add_flags(self, p) -> None:
        p.add_argument("--long-context", type=int, metavar="TOKENS",
                       help="measure acceptance against position up to TOKENS")
        p.add_argument("--long-context-file", help="text to cut the long-context prompts from (default: the prompt set)")
        p.add_argument("--long-context-rungs", type=int, metavar="N",
                       help="long-context prompt lengths between the short prompts and TOKENS (default 8)")
        p.add_argument("--long-context-per-rung", type=int, metavar="N", help="prompts per length (default 2)")

    def apply_flags(self, case, a):
        """[long_context] with the flags on top; a file flag is taken from the working directory."""
        lc = case.long_context
        pick = lambda flag, have: flag if flag is not None else have  # noqa: E731
        lc = replace(lc, length=pick(a.long_context, lc.length), rungs=pick(a.long_context_rungs, lc.rungs),
                     per_rung=pick(a.long_context_per_rung, lc.per_rung),
                     file=str(Path(a.long_context_file).resolve()) if a.long_context_file else lc.file)
        return replace(case, long_context=lc)

    def compute(self, ctx: Context) -> LongContextSection | None:
        """The trained layout replayed in eagle3 mode on the ladder's pass, primary tree."""
        if ctx.layout is None or LONG_CONTEXT not in ctx.extra:
            return None
        inp = ctx.inp
        ev, ref, shape = inp.case.evaluate, inp.regimes[0], inp.shapes[0]
        layouts = {c.label: c.layout for c in inp.candidates}
        ids = {ref: ctx.cache.extra_passes[LONG_CONTEXT]} if ctx.cache is not None else {}
        res = cached_replay(ctx.cache, ids, ctx.drafter, ctx.embed, ctx.head, {ref: ctx.extra[LONG_CONTEXT]},
                            [Variant(ctx.layout, "eagle3", shape, ref, ref, "raw")], layouts,
                            token_budget=ev.token_budget, progress=ctx.progress)
        e = summarize(res[0], buckets=(), seed=ev.seed, n_boot=ev.bootstrap)
        return long_context_section(e, length=inp.case.long_context.length, source=inp.long_source,
                                    seed=ev.seed, n_boot=ev.bootstrap)

    def verdicts(self, sec: LongContextSection, others=None) -> list[Verdict]:
        if not sec.rungs:
            return []
        short = sec.short_context
        curve = ", ".join(f"{r.position}: {fmt(r.accept_length)}" for r in sec.rungs)
        head = (f"on {sec.layout}, {sec.tree}, prompts up to {sec.length} tokens cut from "
                f"{sec.source} (accept length by prompt length: {curve})")
        at = sec.falls_below_half_at
        if at is None:
            return [Verdict("long-context", "info", f"Acceptance holds up to {sec.length} tokens {head}.",
                            to_json(sec))]
        row = next(r for r in sec.rungs if r.position == at)
        return [Verdict("long-context", "warning",
                        f"LONG CONTEXT: from position {at} the drafter accepts {fmt(row.accepted_drafts)} drafts per "
                        f"round, below half of its short-context {fmt(short.accepted_drafts)} (accept length "
                        f"{fmt(row.accept_length)} vs {fmt(short.accept_length)}) {head}. Check the drafter's "
                        f"RoPE settings against its training length (diag lint), or train it on longer sequences.",
                        to_json(sec))]

    def markdown(self, sec: LongContextSection, rep: dict) -> list[str]:
        at = sec.falls_below_half_at
        out = ["## Long context", "",
               f"Prompts of graded length up to {sec.length} tokens, cut from `{sec.source}`, continued greedily; "
               f"`{sec.layout}` on {sec.tree}. A rung is marked ▼ when its accepted drafts per round fall below "
               f"half of the shortest rung's ({f(sec.half_of_short)})"
               + (f": first at position {at}." if at is not None else ": none is."), "",
               "| prompt length | prompts | rounds | accept length | 95% CI | accepted drafts | |",
               "|---|---|---|---|---|---|---|"]
        for r in sec.rungs:
            out.append(f"| {r.position} | {r.prompts} | {r.rounds} | {f(r.accept_length)} | "
                       f"{ci(r.ci95)} | {f(r.accepted_drafts)} | {'▼' if r.below_half else ''} |")
        return out + ["", *plot_link(rep, "long_context.png"), ""]

    def plots(self, sec: LongContextSection, rep: dict, folder: Path) -> list[dict]:
        """Accept length against prompt length (the long-context ladder), 95% intervals as error
        bars, the half-of-short-context line, marked rungs in red."""
        rows = [r for r in sec.rungs if r.accept_length is not None]
        if not rows:
            return []
        from diag.report.figure import WIDE, figure, save     # matplotlib: only when a plot is drawn
        fig, (ax,) = figure(1, panel=WIDE)
        xs, ys = [r.position for r in rows], [r.accept_length for r in rows]
        err = [[y - (r.ci95[0] if r.ci95[0] is not None else y) for y, r in zip(ys, rows)],
               [(r.ci95[1] if r.ci95[1] is not None else y) - y for y, r in zip(ys, rows)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{sec.layout} {sec.tree}")
        if sec.half_of_short is not None:
            ax.axhline(1 + sec.half_of_short, color="k", ls="--", lw=1, label="half of short-context acceptance")
        low = [r for r in rows if r.below_half]
        if low:
            ax.scatter([r.position for r in low], [r.accept_length for r in low], color="red", zorder=3,
                       s=60, label="below half")
        ax.set(xlabel="prompt length (tokens): where the continuation starts", ylabel="accept length (bonus included)",
               title=f"long context up to {sec.length} tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        return [save(fig, folder, "long_context.png", "Acceptance against position (long-context ladder)")]
