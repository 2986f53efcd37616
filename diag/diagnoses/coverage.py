"""Draft-vocabulary coverage: how many of the target's continuation tokens the drafter can
propose at all, and what that caps; the section, its verdict and its Markdown.

An EAGLE-3 drafter proposes only tokens of its hot vocabulary (t2d true; d2t maps them back).
A continuation token outside it can never be drafted, so a round's accepted drafts stop at the
first uncovered token of its window.

Ceiling, two ways:
  formula   uncovered share u spread independently over positions: a chain of depth S accepts
            at most d tokens with probability (1-u)^d, so
                ceiling(u, S) = 1 + sum_{d=1..S} (1-u)^d = 1 + (1-u)(1-(1-u)^S)/u
            worked example: u = 0.10, S = 3 -> 1 + 0.9 + 0.81 + 0.729 = 3.439
            (u = 0 gives S + 1, the most a depth-S tree can reach).
  measured  a perfect drafter that proposes the target's token whenever it is covered, run on
            the real continuations: per round the leading covered tokens of its window (at most
            S), visited as a real decode visits rounds. Clustered uncovered tokens (a word in
            another script, a run of bytes) cap less than the formula says.

Also: the share of the served drafter's rejections that fall on an uncovered token (the
rejections no training can remove without a larger hot vocabulary), the most frequent
uncovered tokens, decoded, and all of it per prompt category. The tokens checked are the
target's argmax along the continuation (what verification compares with).

Verdict: a warning when the 95% interval of the share of the served drafter's rejections that
fall on a token outside its hot vocabulary lies above LIMITS_AT = 0.10: at least one rejection
in ten is one no better-trained drafter with this vocabulary could avoid. Otherwise ok. The
text quotes the uncovered share of the continuation, the ceiling it implies and the most
frequent uncovered tokens. This module knows token ids, t2d, statistics and the report's words;
nothing about models or files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from diag.diagnoses.protocol import Context, Diagnosis
from diag.diagnoses.typed import CI95, COUNT, RATE, TREE, meta, to_json
from diag.replay.replay import seq_roots
from diag.replay.round_accounting import ACCOUNTINGS, RoundAccounting, accounting_for
from diag.replay.verify import target_next_windows, trajectory
from diag.report.sections.cells import f
from diag.report.views import quoted
from diag.run.inputs import round_accounting
from diag.run.verdicts.record import Verdict, fmt
from diag.stats import bootstrap_ci

TOP = 10              # most frequent uncovered tokens listed
LIMITS_AT = 0.10      # rejections at uncovered tokens from which the vocabulary limits acceptance


def ceiling(u: float, num_steps: int) -> float:
    """1 + sum_{d=1..S} (1-u)^d (module docstring). ceiling(0.1, 3) = 3.439."""
    return 1.0 + sum((1.0 - u) ** d for d in range(1, num_steps + 1))


def continuation_targets(tp, i: int) -> torch.Tensor:
    """[C] the target's greedy token at each continuation position of sequence i:
    argmax[prompt_len-1 .. T-2] (argmax[j] = the token after index j)."""
    s = tp.sequences[i]
    return tp.argmax[i][s.prompt_len - 1:s.emitted - 1]


def perfect_rounds(tp, i: int, covered: torch.Tensor, num_steps: int, max_steps: int,
                   accounting: RoundAccounting = ACCOUNTINGS["window"]) -> list[int]:
    """Trajectory rounds of a perfect-within-vocabulary drafter on sequence i: per root j the
    leading covered tokens of t_{j+2..j+1+S}. Roots as replay's (seq_roots under the engine's
    round accounting), so the rounds are the ones the served drafter is scored on, the last
    rounds of a request scored on the target's lookahead past its end under "to-end".
    Window [7, 3, 9] with 3 uncovered -> 1."""
    s = tp.sequences[i]
    roots = list(seq_roots(s, max_steps, accounting))
    if not roots:
        return []
    win = target_next_windows(tp.argmax[i], num_steps)[roots]                   # [R, S]
    ok = covered[win.clamp(min=0)] & (win >= 0)
    acc = ok.to(torch.int64).cumprod(-1).sum(-1)                                # [R]
    return acc[trajectory(acc)].tolist()


def rejected_uncovered(tp, evaluation, covered: torch.Tensor) -> list[tuple[int, int]]:
    """Per prompt (rejections at an uncovered token, rejections) over the evaluation's
    trajectory rounds: a round rooted at j that accepted a < S drafts was rejected at
    t_{j+2+a} = argmax[j+1+a]."""
    S = evaluation.shape.num_steps
    out = []
    for i, p in enumerate(evaluation.per_prompt):
        am, bad, total = tp.argmax[i], 0, 0
        for a, j in zip(p.accepted, p.roots):
            if a < S and j + 1 + a < len(am):
                total += 1
                bad += int(not covered[am[j + 1 + a]])
        out.append((bad, total))
    return out


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Share:
    """A pooled fraction Σbad / Σtotal with a bootstrap interval over prompts."""
    share: float | None = meta(schema=RATE)
    ci95: tuple[float | None, float | None] = meta(schema=CI95)
    count: int = meta(schema=COUNT)
    of: int = meta(schema=COUNT)


@dataclass(frozen=True)
class TopToken:
    token: int = meta(schema=COUNT)
    text: str = meta()
    count: int = meta(schema={"minimum": 1})
    share: float = meta(schema=RATE)          # of all continuation tokens


@dataclass(frozen=True)
class Category:
    category: str
    prompts: int = meta(schema={"minimum": 1})
    uncovered: Share = meta()
    ceiling_formula: float | None = meta()
    ceiling_measured: float | None = meta()
    rejected_at_uncovered: Share = meta()


@dataclass(frozen=True)
class CoverageSection:
    layout: str
    tree: str = meta(schema=TREE)
    num_steps: int = meta(schema={"minimum": 1})
    hot_vocabulary: int = meta(schema=COUNT)
    vocabulary: int = meta(schema={"minimum": 1})
    uncovered: Share = meta()
    ceiling_formula: float | None = meta()
    ceiling_measured: float | None = meta()
    rejected_at_uncovered: Share = meta()
    accept_length: float | None = meta()
    top_uncovered: tuple[TopToken, ...] = meta()
    by_category: tuple[Category, ...] = meta()


def _share(pairs: list[tuple[int, int]], seed: int, n_boot: int) -> Share:
    """Pooled share Σbad / Σtotal with a bootstrap interval over prompts."""
    bad, total = sum(b for b, _ in pairs), sum(t for _, t in pairs)
    if not total:
        return Share(None, (None, None), 0, 0)
    keep = [(b, t) for b, t in pairs if t]
    lo, hi = bootstrap_ci([b / t for b, t in keep], seed=seed, n=n_boot, weights=[t for _, t in keep])
    return Share(bad / total, (lo, hi), bad, total)


def _group(tp, covered, num_steps, max_steps, idx: list[int], seed: int, n_boot: int,
           accounting: RoundAccounting):
    """(uncovered share, ceiling formula, ceiling measured) over the sequences `idx`."""
    pairs, rounds = [], []
    for i in idx:
        toks = continuation_targets(tp, i)
        pairs.append((int((~covered[toks]).sum()), len(toks)))
        rounds.extend(perfect_rounds(tp, i, covered, num_steps, max_steps, accounting))
    u = _share(pairs, seed, n_boot)
    return (u, None if u.share is None else ceiling(u.share, num_steps),
            1.0 + sum(rounds) / len(rounds) if rounds else None)


def coverage_section(tp, t2d: torch.Tensor, evaluation, decode: Callable[[list[int]], str], *,
                     max_steps: int, seed: int, n_boot: int,
                     accounting: RoundAccounting = ACCOUNTINGS["window"]) -> CoverageSection:
    """`tp`: the reference pass; `evaluation`: the served drafter on the trained layout and
    primary tree (its rejections are classified); `max_steps`: the run's deepest tree;
    `accounting`: the rounds the served engine counts (replay/round_accounting.py)."""
    covered = t2d.to(torch.bool).cpu()
    S = evaluation.shape.num_steps
    cats: dict[str, list[int]] = {}
    for i, s in enumerate(tp.sequences):
        cats.setdefault(s.category, []).append(i)
    counts = Counter()
    for i in range(len(tp.sequences)):
        toks = continuation_targets(tp, i)
        counts.update(toks[~covered[toks]].tolist())
    total = sum(len(continuation_targets(tp, i)) for i in range(len(tp.sequences)))
    rej = rejected_uncovered(tp, evaluation, covered)
    by_cat = tuple(Category(c, len(idx), *_group(tp, covered, S, max_steps, idx, seed, n_boot, accounting),
                            _share([rej[i] for i in idx], seed, n_boot)) for c, idx in sorted(cats.items()))
    return CoverageSection(evaluation.layout, evaluation.tree, S, int(covered.sum()), int(covered.numel()),
                           *_group(tp, covered, S, max_steps, list(range(len(tp.sequences))), seed, n_boot, accounting),
                           _share(rej, seed, n_boot), evaluation.accept_length,
                           tuple(TopToken(t, decode([t]), n, n / max(total, 1)) for t, n in counts.most_common(TOP)),
                           by_cat)


# ---- the diagnosis --------------------------------------------------------------------------

def _pct(x, none: str = "n/a") -> str:
    return none if x is None else f"{100 * x:.1f}%"


class Coverage(Diagnosis):
    name = "coverage"
    Section = CoverageSection

    def compute(self, ctx: Context) -> CoverageSection | None:
        served = ctx.served_eagle3()
        if served is None:
            return None
        ev = ctx.inp.case.evaluate
        return coverage_section(ctx.reference_pass, ctx.drafter.t2d, served, ctx.inp.tokenizer.decode,
                                max_steps=max(s.num_steps for s in ctx.inp.shapes), seed=ev.seed, n_boot=ev.bootstrap,
                                accounting=accounting_for(round_accounting(ctx.inp.case)))

    def verdicts(self, sec: CoverageSection, others=None) -> list[Verdict]:
        if sec.uncovered.share is None:
            return []
        u, rej = sec.uncovered, sec.rejected_at_uncovered
        top = ", ".join(f"{t.text!r} ({t.count})" for t in sec.top_uncovered[:5]) or "none"
        worst = max(sec.by_category, key=lambda c: c.uncovered.share or 0.0)
        core = (f"{_pct(u.share)} of the target's continuation tokens (95% CI {_pct(u.ci95[0])}-"
                f"{_pct(u.ci95[1])}) are outside the drafter's hot vocabulary of {sec.hot_vocabulary} "
                f"(t2d false); that caps accept length on {sec.tree} at {fmt(sec.ceiling_measured)} for a "
                f"perfect drafter ({fmt(sec.ceiling_formula)} if they were spread evenly; measured "
                f"{fmt(sec.accept_length)}). {_pct(rej.share)} of the drafter's rejections fall on such a "
                f"token (95% CI {_pct(rej.ci95[0])}-{_pct(rej.ci95[1])}). Most frequent uncovered: {top}. "
                f"Most uncovered category: {worst.category} ({_pct(worst.uncovered.share)}).")
        if rej.ci95[0] is not None and rej.ci95[0] > LIMITS_AT:
            return [Verdict("vocabulary-coverage", "warning", "DRAFT VOCABULARY LIMITS ACCEPTANCE: " + core
                            + " Retrain with a hot vocabulary drawn from the served traffic.", to_json(sec))]
        return [Verdict("vocabulary-coverage-ok", "ok", "Draft vocabulary coverage does not limit acceptance: "
                        + core, to_json(sec))]

    def markdown(self, sec: CoverageSection, rep: dict) -> list[str]:
        u, rej = sec.uncovered, sec.rejected_at_uncovered
        out = ["## Draft-vocabulary coverage", "",
               f"The drafter can propose {sec.hot_vocabulary} of {sec.vocabulary} target tokens (t2d true). "
               f"{_pct(u.share, '–')} of the target's continuation tokens [{_pct(u.ci95[0], '–')}, "
               f"{_pct(u.ci95[1], '–')}] lie outside; {_pct(rej.share, '–')} of the drafter's rejections on "
               f"`{sec.layout}`, {sec.tree} fall on such a token. Ceiling for a perfect drafter (accept length): "
               f"measured on these continuations {f(sec.ceiling_measured)}, formula 1 + Σ_(d=1..S) (1−u)^d = "
               f"{f(sec.ceiling_formula)}; the drafter reaches {f(sec.accept_length)}.", "",
               "| category | prompts | uncovered | 95% CI | ceiling (measured) | ceiling (formula) | "
               "rejections at uncovered |", "|---|---|---|---|---|---|---|"]
        for c in sec.by_category:
            cu = c.uncovered
            out.append(f"| {c.category} | {c.prompts} | {_pct(cu.share, '–')} | {_pct(cu.ci95[0], '–')}–"
                       f"{_pct(cu.ci95[1], '–')} | {f(c.ceiling_measured)} | {f(c.ceiling_formula)} | "
                       f"{_pct(c.rejected_at_uncovered.share, '–')} |")
        if sec.top_uncovered:
            out += ["", "Most frequent uncovered tokens: " + ", ".join(
                f"{quoted(t.text)} (id {t.token}, {t.count}×)" for t in sec.top_uncovered)]
        return out + [""]
