"""Lint checks of positions: RoPE theta, scaling and the longest position, drafter vs target.

Each check takes the Pair (pair.py) and returns Findings.
"""

from __future__ import annotations

from diag.checkpoint.config import text_config
from diag.checks.lint.pair import Finding, Pair


def _rope(cfg: dict) -> tuple[object, object, object]:
    """(theta, scaling without theta, max positions); transformers 5 keeps
    theta inside rope_parameters."""
    c = text_config(cfg)
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = c.get("rope_theta", params.pop("rope_theta", None))
    params.pop("rope_theta", None)
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (kind, tuple(sorted((k, str(v)) for k, v in params.items()
                                      if k not in ("rope_type", "type")))), \
        c.get("max_position_embeddings")


def check_rope(p: Pair) -> list[Finding]:
    (dt, ds, dm), (tt, ts, tm) = _rope(p.drafter), _rope(p.target)
    own = "SGLang applies the drafter's own RoPE settings to draft positions"
    out = []
    if dt is not None and tt is not None and float(dt) != float(tt):
        out.append(Finding("warning", "ROPE_THETA", f"drafter rope_theta {dt} != target {tt}",
                           own, "confirm the drafter was trained with this theta",
                           p.drafter_file, "rope_theta"))
    if ds != ts:
        out.append(Finding("warning", "ROPE_SCALING", f"drafter RoPE scaling {ds[0]} != target "
                           f"{ts[0]} ({ds[1]} vs {ts[1]})", own, "copy the scaling the drafter "
                           "was trained with", p.drafter_file, "rope_scaling"))
    if isinstance(dm, int) and isinstance(tm, int) and dm < tm:
        out.append(Finding("warning", "MAX_POSITIONS", f"drafter max_position_embeddings {dm} < "
                           f"target {tm}", "requests longer than the drafter's range run its "
                           "RoPE outside what it was configured for", "raise the drafter's "
                           "max_position_embeddings (and scaling) to the serving context",
                           p.drafter_file, "max_position_embeddings"))
    return out
