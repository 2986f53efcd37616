"""When the optional `sglang` package is importable, ask its own ServerArgs for the effective
settings of a launch line and report every disagreement with diag's mirror of the rules.
The one module of diag that imports sglang, lazily."""

from __future__ import annotations

from diag.checks.lint.pair import Finding
from diag.engines.sglang.launch import EffectiveConfig


def compare_with_sglang(eff: EffectiveConfig, resolved: dict) -> list[Finding]:
    """Findings for every setting where sglang's own ServerArgs differs from diag's."""
    shape = eff.tree.shape if eff.tree is not None else None
    ours = {"speculative_algorithm": eff.algorithm,
            "speculative_num_steps": shape and shape.num_steps,
            "speculative_eagle_topk": shape and shape.topk,
            "speculative_num_draft_tokens": shape and shape.num_draft_tokens,
            "max_running_requests": eff.max_running_requests}
    return [Finding("warning", "SGLANG_DISAGREES", f"{key}: diag says {ours[key]!r}, sglang's "
                    f"ServerArgs says {resolved[key]!r}", "sglang's own value is what runs",
                    "report this to diag; trust sglang's value", None, key)
            for key in ours if key in resolved and resolved[key] != ours[key]]


def sglang_cross_check(eff: EffectiveConfig, argv: list[str]) -> list[Finding]:
    """Resolve the launch with sglang's ServerArgs when sglang is importable."""
    if not eff.engine.startswith("sglang-"):       # another engine's launch: nothing to ask sglang
        return []
    try:
        from sglang.srt.server_args import prepare_server_args
    except ImportError:
        return [Finding("info", "SGLANG_UNAVAILABLE", "sglang is not installed: diag's own "
                        f"mirror of {eff.engine}'s rules was used, not cross-checked",
                        "n/a", "pip install 'diag[sglang]' to cross-check")]
    try:
        args = prepare_server_args(argv)
    except Exception as exc:  # sglang raises many kinds; each is reported, none hidden
        return [Finding("info", "SGLANG_CROSS_CHECK_FAILED", f"sglang's ServerArgs could not "
                        f"resolve the launch: {type(exc).__name__}: {exc}", "n/a",
                        "run lint where the model paths exist")]
    keys = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "max_running_requests")
    return compare_with_sglang(eff, {k: getattr(args, k, None) for k in keys})
