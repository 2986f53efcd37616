"""Value checks of a case that parsing its types alone does not make: ranges, tree shapes
the engine refuses, regime names, the engine version and the serving algorithm. Run on every
case after the command-line overrides, so a flag gets the same checks as a case file
(`--max-new-tokens 0`, `--limit -1`).

Ranges are data (RANGES): field, the test, what is expected. Trees follow the engine's own
rules (EngineRules.resolve_tree): a shape the engine refuses at its first draft is an error naming
the tree; one it rewrites is run as it runs it, with a note (diag.run.inputs.tree_shapes).
Worked example: trees = ["s3-k4-d100"] -> DiagError field evaluate.trees, found "s3-k4-d100:
RuntimeError: selected index k out of range ... num_draft_tokens - 1 = 99 exceeds the 36
candidates". trees = ["s3-k1-d8"] -> runs as chain-3 (topk = 1 forces D = S + 1 = 4).

This module knows the case's dataclasses and the engine's tree rules; it reads no files.
"""

from __future__ import annotations

from diag.engines import EngineRules, Release, engine, rules
from diag.errors import DiagError, check_environment
from diag.trees import tree_shape


def _positive_ms(v) -> bool:
    return v is None or v > 0


def _verify_costs(v) -> bool:
    """{"4": 21.5, ...}: keys are num_draft_tokens >= 2, values positive milliseconds."""
    return v is None or (bool(v) and all(str(k).isdigit() and int(k) >= 2 and isinstance(x, (int, float))
                                         and not isinstance(x, bool) and x > 0 for k, x in v.items()))


def _buckets(v) -> bool:
    return bool(v) and v[0] == 0 and all(b > a for a, b in zip(v, v[1:]))


# (section, key, test, expected). Example: limit = -1 -> "prompts.limit: expected a positive
# number of prompts (omit it for all), found -1" (it used to keep all prompts but the last).
RANGES = (
    ("prompts", "limit", lambda v: v is None or v >= 1, "a positive number of prompts (omit it for all)"),
    ("evaluate", "bootstrap", lambda v: v >= 100,
     ">= 100 resamples (fewer give 95% intervals that move from run to run)"),
    ("evaluate", "seed", lambda v: v >= 0, ">= 0"),
    ("evaluate", "position_buckets", _buckets, "ascending bucket starts beginning at 0, e.g. [0, 64, 128]"),
    ("placement", "gpus", lambda v: v >= 0, ">= 0 (0: the CPU)"),
    ("placement", "microbatches", lambda v: v >= 1,
     ">= 1 parts of each generation batch (1: the batch whole; as many as the GPUs keep each busy)"),
    ("speedup", "context", lambda v: v >= 1, ">= 1 token of context"),
    ("speedup", "t_decode_ms", _positive_ms, "a positive number of milliseconds"),
    ("speedup", "t_draft_ms", lambda v: v is None or v >= 0, "a non-negative number of milliseconds"),
    ("speedup", "t_verify_ms", _verify_costs,
     'a table of num_draft_tokens (>= 2) -> positive milliseconds, e.g. {"4" = 21.5}'),
)


def check_ranges(case) -> None:
    for section, key, ok, expected in RANGES:
        value = getattr(getattr(case, section), key)
        if not ok(value):
            raise DiagError("case value out of range", file=case.source, field=f"{section}.{key}",
                            expected=expected, found=value)


def _rules(case) -> tuple[Release, EngineRules]:
    """The case's engine and its rules; its newest release while the version itself is still
    unchecked (check_serving reports an unknown one, naming its field)."""
    eng = rules(case.serving.engine)
    try:
        return engine(case.serving.engine), eng
    except DiagError:
        return eng.release(eng.releases()[-1]), eng


def check_trees(case) -> None:
    """Every named tree is one the engine runs; a case with no tree at all is an error too."""
    ev = case.evaluate
    if not ev.trees and not ev.tree_grid:
        raise DiagError("the case names no tree shape", file=case.source, field="evaluate.trees",
                        expected="at least one shape, e.g. chain-3, or a tree_grid", found="[]")
    for text in ev.trees:
        shape = tree_shape(text, field="evaluate.trees")
        if shape.wasted_steps:
            raise DiagError("this tree verifies fewer tokens than it drafts: its last draft steps are never "
                            "verified", file=case.source, field="evaluate.trees",
                            expected=f"num_draft_tokens - 1 >= num_steps = {shape.num_steps} (a node at depth j "
                                     f"needs its whole path in the verify tree)",
                            found=f"{text}: {shape.num_draft_tokens - 1} verified token(s) per round, "
                                  f"{shape.wasted_steps} of {shape.num_steps} draft steps wasted",
                            hint=f"s{shape.num_draft_tokens - 1}-k{shape.topk}-d{shape.num_draft_tokens} drafts the "
                                 f"same trees in fewer steps; or raise num_draft_tokens to {shape.num_steps + 1}")
        rel, eng = _rules(case)
        resolved = eng.resolve_tree(shape.num_steps, shape.topk, shape.num_draft_tokens, None, release=rel)
        if resolved.crash is not None:
            raise DiagError(f"{eng.display} cannot run this tree shape", file=case.source, field="evaluate.trees",
                            expected=f"num_draft_tokens - 1 <= K + (S-1)K^2 = {shape.num_candidates} "
                                     f"for S={shape.num_steps}, K={shape.topk}",
                            found=f"{text}: {resolved.crash}")


def check_regimes(case) -> None:
    """Regime names parse now, not after the reference regime's target pass."""
    from diag.target.regimes import regime
    for text in (*case.evaluate.regimes, case.evaluate.reference_regime):
        if not text.startswith("ckpt:"):
            try:
                regime(text)
            except DiagError as err:
                raise DiagError(err.message, file=case.source, field="evaluate.regimes",
                                expected=err.expected, found=err.found) from err


def check_serving(case) -> None:
    """The engine version is one diag knows, the algorithm one it can emulate."""
    for fn, value, key in ((engine, case.serving.engine, "serving.engine"),
                           (rules(case.serving.engine).mode_of, case.serving.algorithm, "serving.algorithm")):
        try:
            fn(value)
        except DiagError as err:
            raise DiagError(err.message, file=case.source, field=key, expected=err.expected,
                            found=err.found) from err


def check_placement(case) -> None:
    """[placement] sizes parse ("130GiB"), as the placement step will parse them; experts =
    "split" spreads each layer's experts over the GPUs, so it needs two or more (the CPU
    holds one copy of everything)."""
    from diag.target.placement import EXPERTS, check_values
    pl = case.placement
    check_values(pl.gpu_memory, pl.activation_budget, file=case.source)
    if pl.experts not in EXPERTS:
        raise DiagError("unknown placement of the routed experts", file=case.source, field="placement.experts",
                        expected='"layer" (with their decoder layer) or "split" (every layer\'s experts over all '
                                 'the GPUs)', found=repr(pl.experts))
    if pl.experts == "split" and pl.gpus < 2:
        raise DiagError("experts split over the GPUs needs at least 2 GPUs", file=case.source,
                        field="placement.experts", expected="placement.gpus >= 2", found=f"gpus = {pl.gpus}",
                        hint='experts = "layer" on one GPU or the CPU')


def check_user_costs(spec, source: str) -> None:
    """[speedup]: verifying D >= 2 tokens costs at least one decode step: t_verify_ms[D] < t_decode_ms
    would put the break-even accept length below 1, a measurement error (seconds, as the speedup
    model holds them: 9.0 ms against 11.0 ms -> speedup.t_verify_ms.4, found 9.0)."""
    t_decode = spec.t_decode_ms / 1e3
    low = {d: t for d, t in ((int(k), float(v) / 1e3) for k, v in spec.t_verify_ms.items()) if t < t_decode}
    if low:
        d = min(low)
        raise DiagError("a verify of D tokens cannot cost less than one plain decode step", file=source,
                        field=f"speedup.t_verify_ms.{d}", expected=f">= t_decode_ms = {spec.t_decode_ms}",
                        found=low[d] * 1e3, hint="the two were measured under different conditions")


def check_case_values(case) -> None:
    check_environment()                       # DIAG_MIX_TREES=yes fails here, not after the load
    check_ranges(case)
    check_placement(case)
    check_trees(case)
    check_regimes(case)
    check_serving(case)
