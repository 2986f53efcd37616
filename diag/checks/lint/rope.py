"""Lint checks of positions: RoPE theta, scaling (YaRN, llama3, linear, ...) and the longest
position, drafter vs target.

Configs spell RoPE three ways, all read into one RopeSpec:
  rope_theta + rope_scaling {"type": "yarn", ...}               DeepSeek-V3, Kimi-K2 (raw HF)
  rope_theta + rope_scaling {"rope_type": "llama3", ...}        Llama-3.1
  rope_parameters {"rope_theta": ..., "rope_type": "yarn", ...}  transformers 5 (Kimi-K2.5 dump)
A missing theta is what the model class defaults to (DEFAULT_THETA, as transformers' Llama
and DeepSeek-V3 configs and SGLang's llama_eagle3 do); a missing or null scaling is "default".
Precedence as SGLang's LlamaDecoderLayer reads it (0.5.23, models/llama.py): rope_parameters, when
present, holds both theta and scaling (a top-level rope_theta is then not read); a top-level
original_max_position_embeddings replaces the scaling's own.
Numbers compare as numbers: YaRN factor 40 (DeepSeek-V3) equals 40.0. A scaling mismatch names
each parameter that differs, e.g. "beta_fast 1.0 vs 32.0".

Each check takes the Pair (pair.py) and returns Findings.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.checkpoint.config import text_config
from diag.checks.lint.pair import Finding, Pair
from diag.engines import rules

DEFAULT_THETA = 10000.0
_TYPE_KEYS = ("rope_type", "type")


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    theta_given: bool
    kind: str                                   # "default", "yarn", "llama3", "linear", ...
    params: tuple[tuple[str, object], ...]      # scaling parameters, numbers as float, sorted
    max_positions: int | None

    def param(self, key: str):
        return dict(self.params).get(key)


def _number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def rope_spec(cfg: dict) -> RopeSpec:
    """Every spelling above -> one RopeSpec. Kimi-K2.5's rope_parameters {"rope_theta": 50000.0,
    "rope_type": "yarn", "type": "yarn", "factor": 64.0, ...} -> theta 50000, kind yarn,
    params (beta_fast, beta_slow, factor, mscale, mscale_all_dim, original_max_position_embeddings)."""
    c = text_config(cfg)
    if c.get("rope_parameters") is not None:
        params = dict(c["rope_parameters"])
        theta = params.get("rope_theta")
    else:
        params, theta = dict(c.get("rope_scaling") or {}), c.get("rope_theta")
    if params and c.get("original_max_position_embeddings"):
        params["original_max_position_embeddings"] = c["original_max_position_embeddings"]
    kind = next((params[k] for k in _TYPE_KEYS if params.get(k)), "default")
    rest = tuple(sorted((k, _number(v)) for k, v in params.items() if k not in (*_TYPE_KEYS, "rope_theta")))
    limit = c.get("max_position_embeddings")
    return RopeSpec(float(theta) if theta is not None else DEFAULT_THETA, theta is not None, str(kind), rest,
                    limit if isinstance(limit, int) else None)


def scaling_differences(d: RopeSpec, t: RopeSpec) -> list[str]:
    """["type default vs yarn"] or ["beta_fast 1.0 vs 32.0", ...]: drafter value first."""
    if d.kind != t.kind:
        return [f"type {d.kind} vs {t.kind}"]
    keys = sorted({k for k, _ in d.params + t.params})
    return [f"{k} {d.param(k)} vs {t.param(k)}" for k in keys if d.param(k) != t.param(k)]


def check_rope(p: Pair) -> list[Finding]:
    d, t = rope_spec(p.drafter), rope_spec(p.target)
    own = f"{rules(p.engine).display} applies the drafter's own RoPE settings to draft positions"
    out = []
    if d.theta != t.theta:
        unset = "" if d.theta_given else f" (not set: the default {DEFAULT_THETA:g} applies)"
        out.append(Finding("warning", "ROPE_THETA", f"drafter rope_theta {d.theta:g}{unset} != target {t.theta:g}",
                           own, "confirm the drafter was trained with this theta", p.drafter_file, "rope_theta"))
    diffs = scaling_differences(d, t)
    if diffs:
        out.append(Finding("warning", "ROPE_SCALING", f"drafter RoPE scaling differs from the target's: "
                           f"{'; '.join(diffs)} (drafter vs target)", own, "keep the scaling the drafter "
                           "was trained with; when the target is YaRN-extended, check the drafter at that "
                           "length (diag run --long-context)", p.drafter_file, "rope_scaling"))
    if d.max_positions is None and t.max_positions is not None:
        out.append(Finding("info", "MAX_POSITIONS", f"drafter config sets no max_position_embeddings "
                           f"(target {t.max_positions})", "the drafter's model class default applies",
                           "write the length the drafter was trained and is served at",
                           p.drafter_file, "max_position_embeddings"))
    elif d.max_positions is not None and t.max_positions is not None and d.max_positions < t.max_positions:
        out.append(Finding("warning", "MAX_POSITIONS", f"drafter max_position_embeddings {d.max_positions} < "
                           f"target {t.max_positions}", "requests longer than the drafter's range run its "
                           "RoPE outside what it was configured for", "raise the drafter's "
                           "max_position_embeddings (and scaling) to the serving context",
                           p.drafter_file, "max_position_embeddings"))
    return out
