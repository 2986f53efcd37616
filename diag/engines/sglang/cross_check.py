"""When the optional `sglang` package is importable, ask its own ServerArgs for the effective
settings of a launch line and report every disagreement with diag's mirror of the rules
(EngineRules.cross_check; `diag lint` shows each as a finding).
The one module of diag that imports sglang, lazily.

Worked example: `--speculative-num-steps 1 --speculative-eagle-topk 1
--speculative-num-draft-tokens 16`: diag says D = 2 (the chain rewrite); were ServerArgs to say
16, that is one FlagProblem SGLANG_DISAGREES on speculative_num_draft_tokens.
"""

from __future__ import annotations

from diag.engines.common import EffectiveConfig, FlagProblem

KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "max_running_requests")


def compare_with_sglang(eff: EffectiveConfig, resolved: dict) -> list[FlagProblem]:
    """A problem for every setting where sglang's own ServerArgs differs from diag's."""
    shape = eff.tree.shape if eff.tree is not None else None
    ours = {"speculative_algorithm": eff.algorithm,
            "speculative_num_steps": shape and shape.num_steps,
            "speculative_eagle_topk": shape and shape.topk,
            "speculative_num_draft_tokens": shape and shape.num_draft_tokens,
            "max_running_requests": eff.max_running_requests}
    return [FlagProblem("SGLANG_DISAGREES", "warning", key, f"{key}: diag says {ours[key]!r}, sglang's "
                        f"ServerArgs says {resolved[key]!r}", "sglang's own value is what runs",
                        "report this to diag; trust sglang's value")
            for key in ours if key in resolved and resolved[key] != ours[key]]


def ask_server_args(eff: EffectiveConfig, argv: list[str]) -> list[FlagProblem]:
    """Resolve the launch with sglang's ServerArgs when sglang is importable."""
    try:
        from sglang.srt.server_args import prepare_server_args
    except ImportError:
        return [FlagProblem("SGLANG_UNAVAILABLE", "info", "", "sglang is not installed: diag's own "
                            f"mirror of {eff.engine}'s rules was used, not cross-checked",
                            "n/a", "pip install 'diag[sglang]' to cross-check")]
    try:
        args = prepare_server_args(argv)
    except Exception as exc:  # sglang raises many kinds; each is reported, none hidden
        return [FlagProblem("SGLANG_CROSS_CHECK_FAILED", "info", "", f"sglang's ServerArgs could not "
                            f"resolve the launch: {type(exc).__name__}: {exc}", "n/a",
                            "run lint where the model paths exist")]
    return compare_with_sglang(eff, {k: getattr(args, k, None) for k in KEYS})
