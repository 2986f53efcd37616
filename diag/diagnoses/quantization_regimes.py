"""Quantization regimes compared (DESIGN.md §7): how far each regime moved the target's states
and answers, and what that cost the drafter; the section (report key `regimes`), its verdicts,
its Markdown and its drift plot.

The regimes themselves are an axis of the run (the case's evaluate.regimes: a target pass and
the evaluations per regime); this diagnosis only compares them. Per regime, against the
reference regime, over the same sequences:
  drift at every captured point (mean per-token cosine, relative L2 over all tokens),
  greedy-token agreement (fraction of positions whose argmax is unchanged),
  accept length on the trained layout (the best eagle3 candidate) and primary tree;
and the cross matrix: accept length with the drafter's features from regime A and the
verifying tokens from regime B, which separates "the drafter's inputs moved" (A varies,
B fixed) from "the target's answers moved" (B varies, A fixed).

Worked example: reference ckpt:bf16 at 2.40, as-loaded (INT4) at 2.10, difference -0.30
[-0.42, -0.18] -> a warning (the interval lies below zero); cross as-loaded->ckpt:bf16 2.15 and
ckpt:bf16->as-loaded 2.35 say the drafter's inputs moved, not the answers.

A regime named "ckpt:PATH" is another checkpoint of the same model (e.g. the BF16 original
of an INT4 target). Nothing when the run has one regime or no trained layout. This module
reads TargetPasses and Evaluation records; no models, no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from diag.diagnoses.protocol import SERVING, Context, Diagnosis
from diag.diagnoses.typed import CI95, TREE, inline, meta, optional, to_json
from diag.replay.evaluation import Axes, one
from diag.report.sections.cells import difference, f
from diag.report.views import plot_link
from diag.run.verdicts.record import Verdict, fmt
from diag.stats import paired_bootstrap_diff
from diag.target.drift import drift
from diag.target.passes import TargetPass

POINT = {"type": "string", "pattern": "^(embed|final|L[0-9]+)$"}
PLOT = "drift.png"


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Drift:
    cosine: float = meta(schema={"minimum": -1.000001, "maximum": 1.000001})
    relative_l2: float = meta(schema={"minimum": 0})


@dataclass(frozen=True)
class Difference:
    difference: float
    ci95: tuple[float, float]


@dataclass(frozen=True)
class Evaluated:
    """A regime's own evaluation on the trained layout (absent when the run has none)."""
    accept_length: float | None = meta(schema={"minimum": 1})
    accept_length_ci95: tuple[float | None, float | None] = meta(schema=CI95)
    vs_reference: Difference | None = optional()     # paired, not for the reference itself


@dataclass(frozen=True)
class Regime:
    regime: str
    argmax_agreement: float = meta(schema={"minimum": 0, "maximum": 1})
    drift: dict[str, Drift] = meta(schema={"propertyNames": POINT})
    evaluated: Evaluated | None = inline()


@dataclass(frozen=True)
class Cross:
    features: str                 # the regime the drafter's features come from
    tokens: str                   # the regime whose tokens verify
    accept_length: float | None = meta(schema={"minimum": 1})


@dataclass(frozen=True)
class RegimesSection:
    reference: str
    layout: str
    tree: str = meta(schema=TREE)
    points: tuple[str, ...] = meta(schema={"items": POINT, "minItems": 1})
    regimes: tuple[Regime, ...] = meta(schema={"minItems": 2})
    cross: tuple[Cross, ...] = meta()

    def crossed(self, feats: str, toks: str) -> float | None:
        return next((c.accept_length for c in self.cross if (c.features, c.tokens) == (feats, toks)), None)


# ---- the computation ------------------------------------------------------------------------

def _flat(tp: TargetPass, name: str) -> torch.Tensor:
    return torch.cat([s.float() for s in tp.states[name]], dim=0)                # [sum T, H]


def argmax_agreement(ref: TargetPass, other: TargetPass) -> float:
    """Fraction of positions (prompt and continuation) where both regimes' greedy token agree."""
    hit = sum(int((a == b).sum()) for a, b in zip(ref.argmax, other.argmax))
    return hit / max(sum(len(a) for a in ref.argmax), 1)


def drift_table(ref: TargetPass, other: TargetPass, points: list[str]) -> dict[str, Drift]:
    d = drift({p: _flat(ref, p) for p in points}, {p: _flat(other, p) for p in points})
    return {p: Drift(float(v.cosine_mean), float(v.relative_l2)) for p, v in d.items()}


def point_order(name: str) -> int:
    """Residual-stream order: embed, L1, L2, ..., final."""
    if name == "embed":
        return 0
    if name == "final":
        return 10 ** 6
    return int(name[1:])


def regime_section(passes: dict[str, TargetPass], reference: str, evals, where: Axes, layout: str | None,
                   *, seed: int, n_boot: int) -> RegimesSection | None:
    """`where`: the run's reference axes; rows are read at layout `layout` (the trained one)."""
    regimes = list(passes)
    if len(regimes) < 2 or layout is None:
        return None
    ref = passes[reference]
    points = sorted(ref.states, key=point_order)
    at = where.but(layout=layout)
    base = one(evals, at, regime=reference, tokens_regime=reference)
    rows = []
    for r in regimes:
        own, evaluated = one(evals, at, regime=r, tokens_regime=r), None
        if own is not None:
            vs = None
            if base is not None and r != reference:
                d, lo, hi = paired_bootstrap_diff(own.trajectory_rounds, base.trajectory_rounds, seed=seed, n=n_boot)
                vs = Difference(d, (lo, hi))
            evaluated = Evaluated(own.accept_length, tuple(own.accept_length_ci95), vs)
        rows.append(Regime(r, argmax_agreement(ref, passes[r]), drift_table(ref, passes[r], points), evaluated))
    cross = tuple(Cross(a, b, e.accept_length) for a in regimes for b in regimes
                  if (e := one(evals, at, regime=a, tokens_regime=b)) is not None)
    return RegimesSection(reference, layout, where.tree, tuple(points), tuple(rows), cross)


# ---- the diagnosis --------------------------------------------------------------------------

def _worst_drift(row: Regime, layout: str) -> tuple[str, Drift]:
    """The most drifted (lowest cosine) capture point of the layout, else of all points."""
    pts = [p for p in layout.split("+") if p in row.drift] or list(row.drift)
    worst = min(pts, key=lambda p: row.drift[p].cosine)
    return worst, row.drift[worst]


class QuantizationRegimes(Diagnosis):
    name = "quantization_regimes"
    key = "regimes"
    Section = RegimesSection
    place = SERVING

    def compute(self, ctx: Context) -> RegimesSection | None:
        ev = ctx.inp.case.evaluate                  # regimes are compared under greedy decoding (ctx.reference)
        return regime_section(ctx.passes, ctx.inp.regimes[0], ctx.evaluations, ctx.reference, ctx.layout,
                              seed=ev.seed, n_boot=ev.bootstrap)

    def verdicts(self, sec: RegimesSection, others=None) -> list[Verdict]:
        """Per regime with a paired difference: a warning when its interval lies below zero."""
        ref, lay, out = sec.reference, sec.layout, []
        for row in sec.regimes:
            if row.regime == ref or row.evaluated is None or row.evaluated.vs_reference is None:
                continue
            own = row.evaluated
            d, (lo, hi) = own.vs_reference.difference, own.vs_reference.ci95
            point, dr = _worst_drift(row, lay)
            text = (f"Regime {row.regime} vs {ref}: accept length {fmt(own.accept_length)} vs "
                    f"{fmt(sec.crossed(ref, ref))} on {lay}, {sec.tree} (difference {d:+.2f}, 95% CI "
                    f"[{lo:+.2f}, {hi:+.2f}]); greedy tokens agree at {row.argmax_agreement:.1%} of positions; "
                    f"largest drift of the layout's points at {point} (cosine {dr.cosine:.4f}, relative L2 "
                    f"{dr.relative_l2:.3f}).")
            inputs, answers = sec.crossed(row.regime, ref), sec.crossed(ref, row.regime)
            if inputs is not None and answers is not None:
                text += (f" Cross matrix: drafter inputs from {row.regime} with {ref}'s tokens give "
                         f"{fmt(inputs)} (the inputs moved); {ref}'s inputs with {row.regime}'s tokens give "
                         f"{fmt(answers)} (the answers moved).")
            out.append(Verdict("quantization", "warning" if hi < 0 else "info", text, to_json(row)))
        return out

    def markdown(self, sec: RegimesSection, rep: dict) -> list[str]:
        ref, points = sec.reference, sec.points
        out = ["## Quantization regimes", "",
               f"Against `{ref}`, over the same sequences; accept length of `{sec.layout}` on {sec.tree}. "
               "Drift per capture point: mean cosine / relative L2.", "",
               "| regime | greedy agreement | accept length | vs reference [95% CI] | "
               + " | ".join(f"`{p}`" for p in points) + " |", "|---" * (4 + len(points)) + "|"]
        for r in sec.regimes:
            own = r.evaluated
            vs = None if own is None or own.vs_reference is None else to_json(own.vs_reference)
            cells = [f"{f(r.drift[p].cosine, 3)} / {f(r.drift[p].relative_l2, 3)}" for p in points]
            out.append(f"| {r.regime} | {f(r.argmax_agreement, 3)} | {f(None if own is None else own.accept_length)} | "
                       f"{difference(vs)} | " + " | ".join(cells) + " |")
        if sec.cross:
            out += ["", "Cross matrix (features from one regime, verifying tokens from another): "
                    + ", ".join(f"{c.features}→{c.tokens}: {f(c.accept_length)}" for c in sec.cross)]
        return out + ["", *plot_link(rep, PLOT), ""]

    def plots(self, sec: RegimesSection, rep: dict, folder: Path) -> list[dict]:
        """drift.png: relative L2 and cosine of each capture point, one line per regime besides the reference."""
        rows = [r for r in sec.regimes if r.regime != sec.reference and r.drift]
        if not rows:
            return []
        from diag.report.figure import figure, save           # matplotlib: only when a plot is drawn
        points = sec.points                                   # residual-stream order: embed, L1, ..., final
        fig, (ax_l2, ax_cos) = figure(2)
        for r in sorted(rows, key=lambda r: r.regime):
            xs = [i for i, p in enumerate(points) if p in r.drift]
            label = f"{r.regime} vs {sec.reference}"
            ax_l2.plot(xs, [r.drift[points[i]].relative_l2 for i in xs], marker="o", label=label)
            ax_cos.plot(xs, [r.drift[points[i]].cosine for i in xs], marker="o", label=label)
        for ax, name in ((ax_l2, "relative L2"), (ax_cos, "mean cosine")):
            ax.set_xticks(range(len(points)), points, rotation=45, fontsize=8)
            ax.set(xlabel="capture point", ylabel=name, title=name)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        return [save(fig, folder, PLOT, "Hidden-state drift per capture point vs the reference regime")]
