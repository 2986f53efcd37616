"""How SGLang turns the three tree flags into the tree it runs (DESIGN.md §5), per version.

Rules, in ServerArgs' order (python/sglang/srt/server_args.py `_handle_speculative_decoding`
up to 0.5.12.post1, python/sglang/srt/arg_groups/speculative_hook.py `_handle_eagle_family`
since 0.5.13):
1. all three flags omitted -> auto defaults keyed on the target's architectures[0] as written
   (`auto_defaults`, from `auto_choose_speculative_params` / `_auto_choose_speculative_params`):
   STANDALONE -> (3, 1, 4); LlamaForCausalLM, Grok1ForCausalLM, Grok1VForCausalLM -> (5, 4, 8);
   a listed DeepSeek-like architecture -> (3, 1, 4); every other architecture -> (5, 4, 8)
   up to 0.5.7 and (3, 1, 4) since 0.5.8. The Kimi-K2.5 wrapper
   (KimiK25ForConditionalGeneration) and Qwen3 are in no list: (3, 1, 4) since 0.5.8.
2. only some given -> SGLang fails (`_partial_flags_crash`), except S and K = 1 given
   without D, where rule 3 fills D in.
3. topk == 1 and D != S + 1 -> D is rewritten to S + 1 (logged as a warning only; the
   same `if` in every release 0.5.6-0.5.23). Example: S=1, K=1, D=16 -> D=2.
4. D - 1 > K + (S-1)K² -> not checked at launch; organize_draft_results calls
   torch.topk(scores, D - 1) over fewer candidates and fails on the first draft.

This module knows flags and shapes; it reads no files.
"""

from __future__ import annotations


from diag.engines.common import ResolvedShape
from diag.engines.sglang.versions import Engine, Since, engine, since, span_of
from diag.trees import TreeShape

# Always (5, 4, 8), in every release 0.5.6-0.5.23.
_WIDE = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
_DEEPSEEK_LIKE_056 = frozenset({
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
    "GptOssForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM"})
_DEEPSEEK_LIKE_0561 = _DEEPSEEK_LIKE_056 | {
    "Glm4MoeForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"}
# The (3, 1, 4) lists while every other architecture still got (5, 4, 8); from 0.5.8 the
# fallback is (3, 1, 4) too, so later additions to the list change nothing.
DEEPSEEK_LIKE: Since = (("0.5.6", _DEEPSEEK_LIKE_056), ("0.5.6.post1", _DEEPSEEK_LIKE_0561),
                        ("0.5.7", _DEEPSEEK_LIKE_0561 | {"MiMoV2FlashForCausalLM"}))
# What every architecture in no list gets.
FALLBACK: Since = (("0.5.6", (5, 4, 8)), ("0.5.8", (3, 1, 4)))


def auto_defaults(architecture: str, eng: Engine | str | None = None,
                  algorithm: str = "EAGLE3") -> tuple[tuple[int, int, int], str]:
    """(S, K, D) SGLang picks when no tree flag is given, and why.
    Examples (0.5.23): "LlamaForCausalLM" -> (5, 4, 8); "KimiK25ForConditionalGeneration" ->
    (3, 1, 4); on 0.5.7 the same wrapper -> (5, 4, 8); STANDALONE -> (3, 1, 4) everywhere."""
    e = engine(eng)
    if algorithm.upper() == "STANDALONE":
        return (3, 1, 4), f"{e.label}: STANDALONE always gets (3, 1, 4)"
    if architecture in _WIDE:
        return (5, 4, 8), f"{e.label}: architectures[0] {architecture} gets (5, 4, 8)"
    if architecture in since(DEEPSEEK_LIKE, e):
        return (3, 1, 4), f"{e.label}: architectures[0] {architecture} is listed for (3, 1, 4)"
    shape = since(FALLBACK, e)
    return shape, (f"{e.label}: architectures[0] {architecture} is in no list, and SGLang "
                   f"{span_of(FALLBACK, e)} gives every such architecture {shape}")


def topk1_draft_tokens(num_steps: int, topk: int, num_draft_tokens: int | None) -> int | None:
    """The D SGLang runs: S + 1 whenever topk is 1 (whatever was asked), else D as given.
    Example: (1, 1, 16) -> 2; (3, 4, 8) -> 8."""
    return num_steps + 1 if topk == 1 else num_draft_tokens


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
                         architecture: str = "LlamaForCausalLM", *, eng: Engine | str | None = None,
                         algorithm: str = "EAGLE3") -> ResolvedShape:
    """Mirror SGLang's server-args resolution of (S, K, D) for a target whose
    architectures[0] is `architecture` (see the module docstring for the rules)."""
    req = (num_steps, topk, num_draft_tokens)
    if req == (None, None, None):
        (s, k, d), why = auto_defaults(architecture, eng, algorithm)
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
