"""Checks that say why a drafter predicts nothing, for the verdict that fires when every
candidate layout sits at the accept-length floor (diag.run.verdicts.floor).

  weights finite     no NaN or Inf in any weight (an error at load, diag.checkpoint.finite;
                     listed so the verdict can say it was checked)
  constant weights   a weight matrix whose values are all equal (e.g. an lm_head saved as
                     zeros: its argmax is always draft id 0)
  d2t order          t = d + d2t[d] strictly ascending in d: SpecForge, EAGLE and speculators
                     build it from the hot target ids sorted ascending (`used_tokens.sort()`;
                     `d2t[i] = used_tokens[i] - i`), so a d2t permuted consistently with t2d
                     still passes the load checks but maps every draft row to a wrong token.
                     Example: used [0, 5, 9] -> d2t [0, 4, 7], mapped [0, 5, 9] ascending;
                     d2t [5, -1, 7] (mapped [5, 0, 9]) has 1 descent.
  vocab coverage     share of the replayed continuation tokens inside the hot vocabulary
                     (t2d): a drafter can only ever propose those.

Pure functions over the drafter's tensors and token ids; no files, no report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOW_COVERAGE = 0.5


@dataclass(frozen=True)
class HealthCheck:
    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def d2t_descents(d2t: torch.Tensor) -> int:
    """How many consecutive draft ids map to a smaller-or-equal target id (0 when ascending)."""
    mapped = torch.arange(len(d2t)) + d2t.long().cpu()
    return int((mapped[1:] <= mapped[:-1]).sum())


def constant_weights(drafter) -> list[str]:
    """Names of the floating matrices (ndim >= 2) whose values are all equal."""
    return [n for n, p in drafter.named_parameters()
            if p.ndim >= 2 and p.numel() > 1 and bool((p == p.reshape(-1)[0]).all())]


def coverage(t2d: torch.Tensor, tokens: torch.Tensor) -> float | None:
    """Share of `tokens` (target ids) that t2d marks hot. Example: t2d hot at {0, 5}, tokens
    [0, 5, 7, 5] -> 0.75."""
    if tokens.numel() == 0:
        return None
    return float(t2d.cpu()[tokens.long().cpu()].float().mean())


def health_checks(drafter, continuation: torch.Tensor) -> tuple[HealthCheck, ...]:
    """Every check above, for this drafter and the target tokens it was asked to predict."""
    d2t, t2d = drafter.d2t, drafter.t2d
    flat = constant_weights(drafter)
    descents = d2t_descents(d2t)
    cov = coverage(t2d, continuation)
    return (
        HealthCheck("weights finite", True, "no NaN or Inf in any drafter or target weight (checked at load)"),
        HealthCheck("constant weights", not flat,
                    "no weight matrix is constant" if not flat else
                    f"{', '.join(flat[:4])} hold a single repeated value (saved as zeros or never trained?)"),
        HealthCheck("d2t order", descents == 0,
                    f"d2t maps the {len(d2t)} draft ids to ascending target ids, as SpecForge, EAGLE and "
                    "speculators write it" if descents == 0 else
                    f"d2t is not ascending: {descents} of {len(d2t) - 1} consecutive draft ids map to a "
                    "smaller target id than the one before (trainers write it sorted): a d2t permuted "
                    "against the lm_head rows it was trained with maps every draft to a wrong token"),
        HealthCheck("vocab coverage", cov is None or cov >= LOW_COVERAGE,
                    "no continuation tokens to check" if cov is None else
                    f"{cov:.0%} of the {continuation.numel()} replayed continuation tokens are in the "
                    f"drafter's {int(t2d.sum())}-token hot vocabulary (t2d)"
                    + ("" if cov >= LOW_COVERAGE else ": the drafter cannot propose most of what the "
                       "target says; was d2t built from another tokenizer's ids?")),
    )
