"""Loops: repeated n-gram cycles in the continuations, and the accept length with and without
the verify rounds that sit inside them; the section, its verdict and its Markdown.

A greedy decode that falls into a cycle ("self.x = x\\n" over and over, or two tokens
alternating) is trivially predictable: every drafter accepts nearly everything there, so a few
looping continuations inflate the headline accept length (a two-token loop reads 3.9 on a
depth-3 chain). The detector (diag.zoo.quality has a tail-only loop_period for the zoo's own
checks; this one finds every cycle anywhere in a continuation):

    for each period p = 1..MAX_PERIOD, token i "repeats" when ids[i] == ids[i-p]; a run of
    consecutive repeats of length >= max(p * (MIN_REPEATS - 1), MIN_RUN) is a loop: the cycle
    ids[start-p:start] shown MIN_REPEATS times or more. Smaller periods claim tokens first.

Worked example: ids [5, 1, 2, 1, 2, 1, 2, 1, 2, 9]: with p = 2, ids[3..8] repeat (1 == ids[1],
2 == ids[2], ...), a run of 6 >= max(2 * 2, 4) -> a loop of period 2 over indices 1..8, its
repeating tokens 3..8. A round rooted at sequence index j drafts t_{j+2}.. and is "in a loop"
when t_{j+2} is a repeating token.

Verdict: when some verify rounds sit inside loops, a warning when the paired 95% interval of
(accept length over all rounds - over the rounds outside loops) lies above zero, the headline
number then being partly the loops' doing; info otherwise. No verdict when nothing loops.
This module knows token ids, rounds and the report's words; no models, no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.diagnoses.protocol import Context, Diagnosis
from diag.diagnoses.typed import CI95, COUNT, TREE, key, meta, to_json
from diag.report.sections.cells import ci, difference, f
from diag.report.views import quoted
from diag.run.verdicts.record import Verdict, fmt
from diag.stats import accept_length_ci, paired_bootstrap_diff

MAX_PERIOD = 8
MIN_REPEATS = 3
MIN_RUN = 4


@dataclass(frozen=True)
class Loop:
    period: int
    start: int          # first index of the first cycle
    end: int            # one past the last repeating index

    @property
    def repeating(self) -> range:
        return range(self.start + self.period, self.end)


def find_loops(ids: list[int]) -> list[Loop]:
    """Every loop (module docstring), ordered by start."""
    claimed = [False] * len(ids)
    loops = []
    for p in range(1, MAX_PERIOD + 1):
        need = max(p * (MIN_REPEATS - 1), MIN_RUN)
        i = p
        while i < len(ids):
            if ids[i] != ids[i - p] or claimed[i]:
                i += 1
                continue
            j = i
            while j < len(ids) and ids[j] == ids[j - p] and not claimed[j]:
                j += 1
            if j - i >= need:
                loops.append(Loop(p, i - p, j))
                claimed[i:j] = [True] * (j - i)
            i = j
    return sorted(loops, key=lambda lp: lp.start)


def repeating_mask(ids: list[int]) -> list[bool]:
    """[len(ids)] True where a token repeats a cycle. The example above -> True at 3..8."""
    mask = [False] * len(ids)
    for lp in find_loops(ids):
        for k in lp.repeating:
            mask[k] = True
    return mask


def split_rounds(per_prompt, masks: list[list[bool]]) -> tuple[list[list[int]], list[list[int]]]:
    """Trajectory rounds per prompt -> (rounds outside loops, rounds inside loops).
    masks[i] covers sequence i's indices; a round rooted at j is inside when masks[i][j+2]."""
    out, inside = [], []
    for p, mask in zip(per_prompt, masks):
        flags = [j + 2 < len(mask) and mask[j + 2] for j in p.roots]
        out.append([a for a, f in zip(p.accepted, flags) if not f])
        inside.append([a for a, f in zip(p.accepted, flags) if f])
    return out, inside


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rounds:
    """Trajectory accept length over a set of rounds (bonus included), with its interval."""
    accept_length: float | None = meta(schema={"minimum": 1})
    ci95: tuple[float | None, float | None] = meta(schema=CI95)
    rounds: int = meta(schema=COUNT)


@dataclass(frozen=True)
class Difference:
    difference: float
    ci95: tuple[float | None, float | None] = meta(schema=CI95)


@dataclass(frozen=True)
class Example:
    prompt: str
    period: int = meta(schema={"minimum": 1})
    start: int = key("from", schema=COUNT)      # sequence index of the first cycle
    end: int = key("to", schema=COUNT)          # one past the last repeating index
    cycle: str = meta()                          # one cycle, decoded


@dataclass(frozen=True)
class LoopsSection:
    layout: str
    tree: str = meta(schema=TREE)
    sequences: int = meta(schema=COUNT)
    sequences_with_loops: int = meta(schema=COUNT)
    periods: tuple[int, ...] = meta(schema={"items": {"minimum": 1}})
    loop_tokens: int = meta(schema=COUNT)
    continuation_tokens: int = meta(schema=COUNT)
    all: Rounds = meta()
    without_loops: Rounds = meta()
    in_loops: Rounds = meta()
    difference: Difference | None = meta()
    examples: tuple[Example, ...] = meta()


def _rounds(rounds: list[list[int]], seed: int, n_boot: int) -> Rounds:
    if not sum(len(r) for r in rounds):
        return Rounds(None, (None, None), 0)
    point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot)
    return Rounds(point, (lo, hi), sum(len(r) for r in rounds))


def loop_section(sequences, evaluation, decode, *, seed: int, n_boot: int, examples: int = 3) -> LoopsSection:
    """`sequences`: the reference pass's; `evaluation`: the trained layout on the primary tree."""
    masks, found = [], []
    for s in sequences:
        ids = s.ids.tolist()
        cont = find_loops(ids[s.prompt_len:s.emitted])
        mask = [False] * len(ids)
        for lp in cont:
            for k in lp.repeating:
                mask[s.prompt_len + k] = True
            found.append((s, lp))
        masks.append(mask)
    outside, inside = split_rounds(evaluation.per_prompt, masks)
    everything = [list(p.accepted) for p in evaluation.per_prompt]
    every, without, within = (_rounds(r, seed, n_boot) for r in (everything, outside, inside))
    diff = None
    if within.rounds and without.rounds:
        d, lo, hi = paired_bootstrap_diff(everything, outside, seed=seed, n=n_boot)
        diff = Difference(d, (lo, hi))
    cycles = tuple(Example(s.prompt_id, lp.period, s.prompt_len + lp.start, s.prompt_len + lp.end,
                           decode(s.ids[s.prompt_len + lp.start:s.prompt_len + lp.start + lp.period].tolist()))
                   for s, lp in found[:examples])
    return LoopsSection(evaluation.layout, evaluation.tree, len(sequences), len({id(s) for s, _ in found}),
                        tuple(sorted({lp.period for _, lp in found})), sum(sum(m) for m in masks),
                        sum(s.emitted - s.prompt_len for s in sequences), every, without, within, diff, cycles)


# ---- the diagnosis --------------------------------------------------------------------------

class Loops(Diagnosis):
    name = "loops"
    Section = LoopsSection

    def compute(self, ctx: Context) -> LoopsSection | None:
        served = ctx.served_eagle3()
        if served is None:
            return None
        ev = ctx.inp.case.evaluate
        return loop_section(ctx.reference_pass.sequences, served, ctx.inp.tokenizer.decode,
                            seed=ev.seed, n_boot=ev.bootstrap)

    def verdicts(self, sec: LoopsSection, others=None) -> list[Verdict]:
        if not sec.in_loops.rounds:
            return []
        share = sec.in_loops.rounds / max(sec.all.rounds, 1)
        core = (f"{share:.0%} of the verify rounds on {sec.layout}, {sec.tree} sit inside repeated cycles "
                f"(periods {', '.join(map(str, sec.periods))}) in {sec.sequences_with_loops} of "
                f"{sec.sequences} continuations; accept length {fmt(sec.all.accept_length)} with them, "
                f"{fmt(sec.without_loops.accept_length)} without, {fmt(sec.in_loops.accept_length)} "
                f"inside loops")
        if sec.examples:
            ex = sec.examples[0]
            core += f" (e.g. prompt {ex.prompt} cycles {ex.cycle!r} from position {ex.start})"
        d = sec.difference
        if d is not None and d.ci95[0] > 0:
            return [Verdict("loops", "warning", f"LOOPS INFLATE ACCEPT LENGTH: {core}; the loops add "
                            f"{d.difference:+.2f} (95% CI [{d.ci95[0]:+.2f}, {d.ci95[1]:+.2f}]). "
                            "Quote the number without loops, or use prompts whose continuations do not loop.",
                            to_json(sec))]
        return [Verdict("loops", "info", core + ".", to_json(sec))]

    def markdown(self, sec: LoopsSection, rep: dict) -> list[str]:
        a, w, i = sec.all, sec.without_loops, sec.in_loops
        out = ["## Loops", "",
               f"Repeated n-gram cycles in the continuations: {sec.sequences_with_loops} of {sec.sequences} "
               f"continuations, {sec.loop_tokens} of {sec.continuation_tokens} tokens"
               + (f", periods {', '.join(map(str, sec.periods))}" if sec.periods else "") + ".", "",
               "| rounds | count | accept length | 95% CI |", "|---|---|---|---|",
               f"| all | {a.rounds} | {f(a.accept_length)} | {ci(a.ci95)} |",
               f"| outside loops | {w.rounds} | {f(w.accept_length)} | {ci(w.ci95)} |",
               f"| inside loops | {i.rounds} | {f(i.accept_length)} | {ci(i.ci95)} |"]
        if sec.difference:
            out += ["", f"All − outside loops: {difference(to_json(sec.difference))} (paired)."]
        if sec.examples:
            out += ["", "Examples: " + "; ".join(f"{x.prompt}: {quoted(x.cycle)} (period {x.period}, positions "
                                                 f"{x.start}–{x.end})" for x in sec.examples)]
        return out + [""]
