"""The typed evaluation record: one variant's acceptance, with named axes, and the one way to
look results up (`select`).

An Evaluation is what every later part of diag reads: verdicts, the speedup and regime
sections, the report writer, the plots, the pytest assertions. Each variant is a point on
named axes (Axes): layout, mode, tree, regime (of the drafter's features), tokens_regime
(whose argmax verifies), rendering (how the prompts became token ids, diag/run/rendering.py),
decoding ("greedy", or a sampled decoding's name such as "t1.0-p0.95-k-1", diag.engines.decoding).
A new axis is a new Axes field with its default, filled by the
producer (`summarize`); every `select(evaluations, where)` with a `where` built from the
run's reference axes then pins it, so a forgotten axis cannot join a ranking silently.

Worked example: reference = Axes(mode="eagle3", tree="chain-3", regime="as-loaded",
tokens_regime="as-loaded") (layout ANY). select(evals, reference) -> every eagle3 layout on
chain-3 as loaded; select(evals, reference, mode="eagle") -> the EAGLE-mode rows.

`to_json` is the only place report.json's evaluation entries are made; `from_json` reads them
back for code that starts from a report (compare, assertions, plots). report.json keeps per
prompt only (category, rounds, accepted_sum); `from_json` turns that into rounds [sum, 0, 0, ...],
which changes no pooled statistic (1 + Σa / rounds). This module knows counts and statistics;
nothing about models, files or Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from diag.engines import report_rates
from diag.metrics import AcceptCounts, bucketed, summary
from diag.replay.categories import CategoryAcceptance, by_category
from diag.replay.verify import trajectory
from diag.stats import accept_length_ci, paired_bootstrap_diff
from diag.trees import TreeShape, tree_shape


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()   # an axis value that matches every value



def _summary(c: AcceptCounts) -> dict:
    """diag.metrics.summary with the accept rates the engines log (EngineRules.report_rates):
    {"rounds": 4, ..., "accept_length_no_bonus": 1.25, "sglang_accept_rate": 0.4167, ...}."""
    return summary(c, tuple((r.field, r.rate) for r in report_rates()))

@dataclass(frozen=True)
class Axes:
    """Where a variant sits. In a record every axis is concrete; in a query (`where`) any axis
    may be ANY. Defaults are ANY, so Axes() matches everything."""

    layout: object = ANY            # candidate label, e.g. "embed+L2+L4" or "final (EAGLE)"
    mode: object = ANY              # "eagle3" | "eagle"
    tree: object = ANY              # shape name, e.g. "chain-3", "s3-k4-d8"
    regime: object = ANY            # regime of the drafter's input features
    tokens_regime: object = ANY     # regime whose argmax verifies
    rendering: object = ANY         # prompt rendering, e.g. "auto", "chat+nothink"
    decoding: object = ANY          # "greedy" or a sampled decoding's name, e.g. "t1.0-p0.95-k-1"

    def but(self, **changes) -> "Axes":
        return replace(self, **changes)

    def matches(self, other: "Axes") -> bool:
        """other (concrete) lies in self (a query)."""
        return all(getattr(self, f.name) is ANY or getattr(self, f.name) == getattr(other, f.name)
                   for f in fields(self))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def key(self) -> str:
        """"embed+L2+L4|eagle3|chain-3|as-loaded", with "->B" for a cross-regime variant and
        "|chat+nothink" for a rendering other than the legacy one (keys of reports written
        before renderings existed stay what they were, and so do records built without one),
        and "@t1.0-p0.95-k-1" for a sampled decoding (greedy keys carry no suffix)."""
        cross = "" if self.regime == self.tokens_regime else f"->{self.tokens_regime}"
        unset = self.rendering is ANY or self.rendering == LEGACY_AXES["rendering"]
        rendering = "" if unset else f"|{self.rendering}"
        dec = "" if self.decoding in (LEGACY_AXES["decoding"], ANY) else f"@{self.decoding}"
        return f"{self.layout}|{self.mode}|{self.tree}|{self.regime}{cross}{rendering}{dec}"


# Axes added after schema 2.0, and the value every record had before they existed.
LEGACY_AXES = {"rendering": "auto", "decoding": "greedy"}


@dataclass(frozen=True)
class PromptRounds:
    """One prompt's trajectory: accepted draft tokens per visited round and each round's
    root position (empty when read back from report.json, which does not keep them). Under
    sampling the rounds of every seed follow each other; `expected` holds each round's exact
    E[accepted] and `seeds` its seed (both empty for greedy)."""

    id: str
    accepted: tuple[int, ...]
    roots: tuple[int, ...] = ()
    category: str = ""              # the prompt's category (dataset); "" in reports before 2.2
    expected: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def accepted_sum(self) -> int:
        return int(sum(self.accepted))

    @property
    def expected_sum(self) -> float | None:
        return float(sum(self.expected)) if self.expected else None


@dataclass(frozen=True)
class PositionBucket:
    start: int                      # root positions in [start, end)
    end: int
    counts: AcceptCounts


@dataclass(frozen=True)
class Evaluation:
    axes: Axes
    shape: TreeShape
    all_positions: AcceptCounts     # a round at every position of the continuation
    trajectory: AcceptCounts        # only the rounds a real decode visits
    accept_length: float | None     # trajectory accept length, bonus included
    accept_length_ci95: tuple[float | None, float | None]
    by_position: tuple[PositionBucket, ...]
    per_prompt: tuple[PromptRounds, ...]
    by_category: tuple[CategoryAcceptance, ...] = ()
    # sampled decodings only (None / empty for greedy): the exact per-round expectation,
    # 1 + mean over the visited rounds of E[accepted | round], its interval over prompts, its
    # P(a >= d) per depth, and the seeds pooled.
    expected_accept_length: float | None = None
    expected_accept_length_ci95: tuple[float | None, float | None] = (None, None)
    expected_acceptance_at_depth: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()

    def __getattr__(self, name: str):
        """e.layout, e.mode, ... read the axes."""
        if name in Axes.__dataclass_fields__:
            return getattr(self.axes, name)
        raise AttributeError(name)

    @property
    def key(self) -> str:
        return self.axes.key

    @property
    def trajectory_rounds(self) -> list[list[int]]:
        return [list(p.accepted) for p in self.per_prompt]

    @property
    def sampled(self) -> bool:
        return self.axes.decoding not in ("greedy", ANY)

    @property
    def judged_accept_length(self) -> float | None:
        """What verdicts rank by: the exact expectation under sampling (DESIGN.md §11 "Noise
        under sampling"), the measured accept length under greedy decoding."""
        return self.expected_accept_length if self.sampled else self.accept_length

    @property
    def judged_ci95(self) -> tuple[float | None, float | None]:
        return self.expected_accept_length_ci95 if self.sampled else self.accept_length_ci95

    @property
    def judged_rounds(self) -> list[list[float]]:
        """Per prompt, what paired comparisons resample: E[a] per round under sampling, a under greedy."""
        return [list(p.expected) for p in self.per_prompt] if self.sampled else self.trajectory_rounds

    def to_json(self) -> dict:
        """The report.json entry (per-round lists go to samples.jsonl, not here)."""
        lo, hi = self.accept_length_ci95
        return {"key": self.key, **self.axes.as_dict(), "axes": self.axes.as_dict(),
                "num_steps": self.shape.num_steps, "topk": self.shape.topk,
                "num_draft_tokens": self.shape.num_draft_tokens,
                "all_positions": _summary(self.all_positions), "trajectory": _summary(self.trajectory),
                "accept_length_ci95": [lo, hi], "accept_length": self.accept_length,
                "by_position": [{"from": b.start, "to": b.end, **_summary(b.counts)} for b in self.by_position],
                "by_category": [c.to_json() for c in self.by_category],
                "per_prompt": [{"id": p.id, "category": p.category, "rounds": p.rounds,
                                "accepted_sum": p.accepted_sum, "expected_sum": p.expected_sum}
                               for p in self.per_prompt],
                "expected_accept_length": self.expected_accept_length,
                "expected_accept_length_ci95": list(self.expected_accept_length_ci95),
                "expected_acceptance_at_depth": list(self.expected_acceptance_at_depth),
                "seeds": list(self.seeds)}

    @classmethod
    def from_json(cls, e: dict) -> "Evaluation":
        axes = axes_of(e)
        shape = TreeShape(e["num_steps"], e["topk"], e["num_draft_tokens"])

        def pooled(total, n):
            return tuple([total] + [0] * (n - 1)) if n else ()
        per_prompt = tuple(PromptRounds(p["id"], pooled(p["accepted_sum"], p["rounds"]), (), p.get("category", ""),
                                        expected=pooled(p["expected_sum"], p["rounds"])
                                        if p.get("expected_sum") is not None else ())
                           for p in e["per_prompt"])
        return cls(axes, shape, AcceptCounts.from_dict(e["all_positions"]),
                   AcceptCounts.from_dict(e["trajectory"]), e["accept_length"],
                   tuple(e["accept_length_ci95"]),
                   tuple(PositionBucket(b["from"], b["to"], AcceptCounts.from_dict(b)) for b in e["by_position"]),
                   per_prompt, tuple(CategoryAcceptance.from_json(c) for c in e.get("by_category", ())),
                   e.get("expected_accept_length"), tuple(e.get("expected_accept_length_ci95") or (None, None)),
                   tuple(e.get("expected_acceptance_at_depth") or ()), tuple(e.get("seeds") or ()))


def axes_of(e: dict) -> Axes:
    """A report.json evaluation entry's axes; an axis it predates reads its LEGACY_AXES value."""
    return Axes(**{k: e.get(k, LEGACY_AXES.get(k)) for k in Axes.__dataclass_fields__ if k in e or k in LEGACY_AXES})


def select(evaluations, where: Axes | None = None, **axes) -> list[Evaluation]:
    """The evaluations inside `where` (default: everything), with `axes` overriding it.
    select(evals, ref, layout="L1+L3+L5") -> that layout at the reference of every other axis."""
    query = (where or Axes()).but(**axes) if axes else (where or Axes())
    return [e for e in evaluations if query.matches(e.axes)]


def one(evaluations, where: Axes | None = None, **axes) -> Evaluation | None:
    """The single evaluation matching, None when there is none; more than one is a bug."""
    hits = select(evaluations, where, **axes)
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} evaluations match {(where or Axes()).but(**axes)}")
    return hits[0] if hits else None


def reference_axes(report: dict) -> Axes:
    """A report's reference axes (its "reference" entry; null -> ANY)."""
    given = report.get("reference") or {}
    return Axes(**{k: ANY if v is None else v for k, v in given.items() if k in Axes.__dataclass_fields__})


def best(evaluations) -> Evaluation | None:
    """The highest judged accept length (ties: the first), ignoring variants without rounds."""
    pool = [e for e in evaluations if e.judged_accept_length is not None]
    return max(pool, key=lambda e: e.judged_accept_length) if pool else None


def tie_interval(top: Evaluation, e: Evaluation, *, seed: int, n_boot: int) -> tuple[float, float, float] | None:
    """(top - e, lo, hi), the paired bootstrap difference of judged rounds, where its 95% interval
    reaches zero (e is indistinguishable from top, DESIGN.md §10); None where e is lower beyond it."""
    d, lo, hi = paired_bootstrap_diff(top.judged_rounds, e.judged_rounds, seed=seed, n=n_boot)
    return (d, lo, hi) if lo <= 0.0 else None


LEAD_MEMO = 8          # lead()'s last answers kept: a run asks about the same evaluations ~6 times


_leads: list[tuple] = []


def lead(evaluations, *, seed: int, n_boot: int, prefer=frozenset()) -> Evaluation | None:
    """`_lead`, remembered for the last LEAD_MEMO questions: a sampled run asks it about the same
    evaluations (frozen, so the same objects give the same answer) from the decode, the verdicts
    and the report, some six times, each a paired bootstrap per layout (0.2 s a pair at 2,000
    prompts: a 14-layout scan paid 2.6 s a question)."""
    evaluations, prefer = list(evaluations), frozenset(prefer)
    for evs, s, n, pf, got in _leads:
        if (s, n, pf) == (seed, n_boot, prefer) and len(evs) == len(evaluations) \
                and all(a is b for a, b in zip(evs, evaluations)):
            return got
    got = _lead(evaluations, seed=seed, n_boot=n_boot, prefer=prefer)
    _leads.append((evaluations, seed, n_boot, prefer, got))
    del _leads[:-LEAD_MEMO]
    return got


def _lead(evaluations, *, seed: int, n_boot: int, prefer=frozenset()) -> Evaluation | None:
    """The evaluation a run reads as its best layout: best(), except under a sampled decoding.
    There a best by a hair is noise: on CUDA a lane's floats move with its batch's width, so
    adding a layout re-decodes the others and can swap two near-tied ones. Under sampling it is,
    among the evaluations whose paired bootstrap difference to the best has a 95% interval
    reaching zero (the layout verdict's "indistinguishable"), the first whose layout is in
    `prefer` (those the drafter's config reads), else the first in the given order (the case's
    candidates'), which no batch moves.
    Example, sampled, order A, B, C: A 3.101, B 3.104 tied, C 2.0 lower -> A; a run where the
    batch made B 3.099 -> A again; with prefer {"B"} -> B both times."""
    top = best(evaluations)
    if top is None or not top.sampled:
        return top
    tied = [e for e in evaluations if e.judged_accept_length is not None
            and (e is top or tie_interval(top, e, seed=seed, n_boot=n_boot) is not None)]
    return next((e for e in tied if e.layout in prefer), tied[0])


# ---- the producer ---------------------------------------------------------------------

def trajectory_rounds(accepted: list[torch.Tensor], roots: list[torch.Tensor]):
    """Per prompt, the rounds a real decode would visit: (accepted counts, root positions)."""
    counts, where = [], []
    for acc, pos in zip(accepted, roots):
        visit = trajectory(acc) if acc.numel() else torch.zeros(0, dtype=torch.long)
        counts.append(acc[visit].tolist())
        where.append(pos[visit].tolist())
    return counts, where


def _buckets(all_acc, roots, buckets: tuple[int, ...], S: int, D: int) -> tuple[PositionBucket, ...]:
    if not roots.numel():
        return ()
    top = int(roots.max()) + 1
    edges = [e for e in buckets if e <= top]
    edges = edges + [max(top, edges[-1] + 1)] if edges else []
    if len(edges) < 2:
        return ()
    counts = bucketed(all_acc, roots, edges, num_steps=S, num_draft_tokens=D)
    return tuple(PositionBucket(a, b, c) for (a, b), c in zip(zip(edges, edges[1:]), counts))


def summarize(res, *, buckets: tuple[int, ...], seed: int, n_boot: int) -> Evaluation:
    """replay.VariantResult -> Evaluation: counts over all rounds and over the trajectory,
    the trajectory accept length with a bootstrap 95% interval over prompts, acceptance by
    position bucket and by prompt category, the per-prompt rounds that paired comparisons
    resample."""
    v = res.variant
    S, D = v.tree.num_steps, v.tree.num_draft_tokens
    all_acc = torch.cat(res.accepted) if res.accepted else torch.zeros(0, dtype=torch.long)
    roots = torch.cat(res.roots) if res.roots else torch.zeros(0, dtype=torch.long)
    traj, traj_roots = trajectory_rounds(res.accepted, res.roots)
    traj_counts = AcceptCounts.from_accepted([a for r in traj for a in r], S, D)
    point, lo, hi = accept_length_ci(traj, seed=seed, n=n_boot) if traj_counts.rounds else (None, None, None)
    cats = res.categories or [""] * len(res.prompt_ids)
    per_prompt = tuple(PromptRounds(pid, tuple(r), tuple(j), c)
                       for pid, r, j, c in zip(res.prompt_ids, traj, traj_roots, cats))
    return Evaluation(v.axes, v.tree, AcceptCounts.from_accepted(all_acc, S, D), traj_counts, point, (lo, hi),
                      _buckets(all_acc, roots, buckets, S, D), per_prompt,
                      by_category(per_prompt, seed=seed, n_boot=n_boot))


def primary_tree(trees: tuple[str, ...] | list[str], evaluations) -> str | None:
    """The first tree a case names (its canonical name), else the first evaluated tree."""
    if trees:
        return tree_shape(trees[0]).name
    return evaluations[0].tree if evaluations else None
