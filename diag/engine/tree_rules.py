"""How SGLang turns the three tree flags into the tree it runs (DESIGN.md §5).

Rules, in ServerArgs' order (python/sglang/srt/server_args.py, `_handle_speculative_decoding`
and `auto_choose_speculative_params`):
1. all three flags omitted -> auto defaults keyed on the target's architectures[0]
   (`auto_defaults`): DeepseekV3ForCausalLM / DeepseekV2ForCausalLM -> (3, 1, 4); every
   other architecture, the Kimi-K2.5 wrapper included -> (5, 4, 8).
2. only some given -> SGLang fails (`_partial_flags_crash`), except S and K = 1 given
   without D, where rule 3 fills D in.
3. topk == 1 and D != S + 1 -> D is rewritten to S + 1 (logged as a warning only).
   Example: S=1, K=1, D=16 -> D=2: one draft token per round, not 16.
4. D - 1 > K + (S-1)K² -> not checked at launch; organize_draft_results calls
   torch.topk(scores, D - 1) over fewer candidates and fails on the first draft.

This module knows flags and shapes; it reads no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.trees import TreeShape

_DEEPSEEK_AUTO = frozenset({"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"})


def auto_defaults(architecture: str) -> tuple[tuple[int, int, int], str]:
    """(S, K, D) SGLang picks when no tree flag is given, and why.
    Example: "DeepseekV3ForCausalLM" -> (3, 1, 4); "KimiK25ForConditionalGeneration" -> (5, 4, 8)."""
    if architecture in _DEEPSEEK_AUTO:
        return (3, 1, 4), f"architectures[0] {architecture} gets (3, 1, 4)"
    return (5, 4, 8), (f"architectures[0] {architecture} is not DeepseekV2/V3ForCausalLM, so it gets "
                       "(5, 4, 8)")


def topk1_draft_tokens(num_steps: int, topk: int, num_draft_tokens: int | None) -> int | None:
    """The D SGLang runs: S + 1 whenever topk is 1 (whatever was asked), else D as given.
    Example: (1, 1, 16) -> 2; (3, 4, 8) -> 8."""
    return num_steps + 1 if topk == 1 else num_draft_tokens


@dataclass(frozen=True)
class ResolvedShape:
    """What SGLang runs for the given flags. `requested` = the flags as given
    (None = omitted). `crash` is the failure SGLang would hit (None if it runs);
    `shape` is None when no shape can be resolved at all."""

    shape: TreeShape | None
    requested: tuple
    notes: tuple[str, ...]
    crash: str | None


def _partial_flags_crash(s, k, d) -> str | None:
    """SGLang: `if num_steps is None: assert topk is None and num_draft_tokens is None`,
    then compares `topk > 1` / `topk == 1` and, for topk > 1, uses D-1 as a topk size."""
    if s is None:
        return ("AssertionError in ServerArgs._handle_speculative_decoding: with "
                "--speculative-num-steps omitted, --speculative-eagle-topk and "
                "--speculative-num-draft-tokens must be omitted too")
    if k is None:
        return ("TypeError: '>' not supported between instances of 'NoneType' and 'int' "
                "(--speculative-eagle-topk omitted while --speculative-num-steps is given)")
    if d is None and k > 1:
        return ("TypeError: unsupported operand type(s) for -: 'NoneType' and 'int' "
                "(--speculative-num-draft-tokens omitted with topk > 1; organize_draft_results "
                "takes topk(num_draft_tokens - 1))")
    return None


def resolve_sglang_shape(num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                         architecture: str = "LlamaForCausalLM") -> ResolvedShape:
    """Mirror SGLang's server-args resolution of (S, K, D) for a target whose
    architectures[0] is `architecture` (see the module docstring for the rules)."""
    req = (num_steps, topk, num_draft_tokens)
    if req == (None, None, None):
        (s, k, d), why = auto_defaults(architecture)
        note = (f"no speculative flags given: SGLang's auto default is num_steps={s}, topk={k}, "
                f"num_draft_tokens={d} ({why})")
        return ResolvedShape(TreeShape(s, k, d), req, (note,), None)
    crash = _partial_flags_crash(*req)
    if crash is not None:
        return ResolvedShape(None, req, (), crash)
    s, k = num_steps, topk
    d = topk1_draft_tokens(s, k, num_draft_tokens)
    notes: list[str] = []
    if d != num_draft_tokens:
        notes.append(f"topk=1 forces num_draft_tokens = num_steps + 1 = {d}"
                     + ("" if num_draft_tokens is None else f" (the requested {num_draft_tokens} is ignored)"))
    shape = TreeShape(s, k, d)
    if d - 1 > shape.num_candidates:
        msg = (f"num_draft_tokens - 1 = {d - 1} exceeds the {shape.num_candidates} candidates "
               f"K + (S-1)K² of num_steps={s}, topk={k}")
        notes.append(msg + "; SGLang does not check this at launch")
        return ResolvedShape(shape, req, tuple(notes),
                             "RuntimeError: selected index k out of range (torch.topk in "
                             "organize_draft_results: " + msg + ")")
    return ResolvedShape(shape, req, tuple(notes), None)


def grid(num_steps: list[int], topk: list[int],
         num_draft_tokens: list[int]) -> tuple[list[TreeShape], list[tuple[tuple, TreeShape]]]:
    """Sweep grid: every (S, K, D) after SGLang's topk=1 rewrite, de-duplicated in
    first-seen order. Returns (shapes, rewritten) where rewritten lists
    ((S, K, D) requested, shape run) for each combination SGLang would change.
    Example: S [3], K [1, 4], D [4, 8] -> chain-3, s3-k4-d4, s3-k4-d8;
    rewritten [((3, 1, 8), chain-3)]."""
    shapes: dict[TreeShape, None] = {}
    rewritten: list[tuple[tuple, TreeShape]] = []
    for s in num_steps:
        for k in topk:
            for d in num_draft_tokens:
                shape = TreeShape(s, k, topk1_draft_tokens(s, k, d))
                if shape.num_draft_tokens != d:
                    rewritten.append(((s, k, d), shape))
                shapes.setdefault(shape, None)
    return list(shapes), rewritten
