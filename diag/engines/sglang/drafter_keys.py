"""Drafter config.json keys SGLang reads besides the layer ids, per version.

use_aux_hidden_state (since 0.5.8; model_executor/model_runner.py, then
  model_runner_components/spec_aux_hidden_state.py since 0.5.16): read ONLY from the nested
  `eagle_config`, default true. False means `set_eagle3_layers_to_capture` is never called:
  the target captures nothing and hands the drafter its final-normed last hidden state
  (the capture point `final`), while the drafter keeps its own lm_head and d2t (EAGLE3).
  0.5.6-0.5.7 ignore the key. A top-level key is ignored in every version.

How many states `fc` is built for, i.e. fc.weight [H, k·H_target]:
  LlamaForCausalLMEagle3 (models/llama_eagle3.py)
    0.5.6–0.5.11   k = 3, whatever the config says
    0.5.12–0.5.23  k = top-level num_aux_hidden_states, else len(nested ids), else 3
  Eagle3DeepseekV2ForCausalLM (models/kimi_k25_eagle3.py, since 0.5.12)
    k = len(nested ids), else len(TOP-LEVEL ids), else 3
  (The hidden-state buffers, speculative/eagle_utils.py, also fall back to top-level ids.)
draft_vocab_size:
  LlamaForCausalLMEagle3, every release 0.5.6-0.5.23: read unguarded (`config_.vocab_size =
    config_.draft_vocab_size` for the draft logits processor, and `if config.draft_vocab_size
    is None` for an untied head). A config.json without the key gives a LlamaConfig without
    the attribute: building the drafter raises AttributeError. `"draft_vocab_size": null`
    is how such a config says "score with the target's lm_head" (load_lm_head_from_target).
  Eagle3DeepseekV2ForCausalLM: getattr(config, "draft_vocab_size", None): absent = null.
Worked example: drafter trained on embed+L3 (fc.weight [H, 2·H_t]), nested ids [0, 3]:
  0.5.11 builds fc for 3 states -> loading the [H, 2·H_t] weight fails;
  0.5.12 builds it for len([0, 3]) = 2 -> loads.
  With no nested ids but num_aux_hidden_states 2: 0.5.12 builds fc for 2, captures the 3
  default layers -> the first draft forward fails on the fc shape.

This module reads config dicts; it knows nothing about weights or files.
"""

from __future__ import annotations

from diag.engines.sglang.versions import Engine, Since, engine, since, span_of

USE_AUX_READ: Since = (("0.5.6", False), ("0.5.8", True))
FC_FROM_CONFIG: Since = (("0.5.6", False), ("0.5.12", True))
MLA_DRAFTERS = frozenset({"Eagle3DeepseekV2ForCausalLM"})
LLAMA_EAGLE3 = "LlamaForCausalLMEagle3"      # the only class that reads draft_vocab_size unguarded


def _nested(drafter_config: dict) -> dict:
    eagle = drafter_config.get("eagle_config")
    return eagle if isinstance(eagle, dict) else {}


def uses_aux_hidden_state(drafter_config: dict, eng: Engine | str | None) -> tuple[bool, str | None]:
    """(whether the engine captures auxiliary states, a note when the key matters).
    Example: {"eagle_config": {"use_aux_hidden_state": False}} on 0.5.23 -> (False, note)."""
    e = engine(eng)
    nested = _nested(drafter_config).get("use_aux_hidden_state")
    top = drafter_config.get("use_aux_hidden_state")
    if nested is None:
        if top is not None and top is not True:
            return True, (f"top-level use_aux_hidden_state={top!r} is ignored by {e.label} (it "
                          "reads only eagle_config.use_aux_hidden_state)")
        return True, None
    if not since(USE_AUX_READ, e):
        return True, f"eagle_config.use_aux_hidden_state is ignored by {e.label} (read since 0.5.8)"
    if bool(nested):
        return True, None
    return False, (f"eagle_config.use_aux_hidden_state = false: {e.label} captures no auxiliary "
                   "states and feeds the drafter the target's final-normed last hidden state")


def drafter_class(drafter_config: dict) -> str:
    """The model class SGLang builds for the drafter: architectures[0] (LlamaForCausalLMEagle3
    when the config names none)."""
    return (drafter_config.get("architectures") or [LLAMA_EAGLE3])[0]


def draft_vocab_crash(drafter_config: dict, eng: Engine | str | None) -> str | None:
    """Why building the drafter fails on a missing draft_vocab_size key, or None.
    {"architectures": ["LlamaForCausalLMEagle3"]} (no key) -> AttributeError text;
    the same with "draft_vocab_size": null, or any other class (Eagle3DeepseekV2ForCausalLM
    reads it with a default, EAGLE-1's LlamaForCausalLMEagle not at all) -> None."""
    if "draft_vocab_size" in drafter_config or drafter_class(drafter_config) != LLAMA_EAGLE3:
        return None
    return (f"{engine(eng).label} models/llama_eagle3.py reads config.draft_vocab_size without a "
            "default, and this drafter config.json has no draft_vocab_size key: building "
            "LlamaForCausalLMEagle3 raises AttributeError ('LlamaConfig' object has no attribute "
            "'draft_vocab_size')")


def fc_inputs(drafter_config: dict, eng: Engine | str | None) -> tuple[int, str]:
    """(k, why): how many capture points SGLang sizes the drafter's fc for."""
    e = engine(eng)
    arch = drafter_class(drafter_config)
    nested = _nested(drafter_config).get("eagle_aux_hidden_state_layer_ids")
    top = drafter_config.get("eagle_aux_hidden_state_layer_ids")
    if arch in MLA_DRAFTERS:
        ids = nested if nested is not None else top
        src = ("eagle_config ids" if nested is not None else
               "top-level ids (no nested ones)" if top is not None else "default")
        k = 3 if ids is None else len(ids)
        return k, f"{e.label} kimi_k25_eagle3.py sizes fc for {k} states ({src})"
    if not since(FC_FROM_CONFIG, e):
        return 3, (f"{e.label} llama_eagle3.py sizes fc for 3 states whatever the config says "
                   f"(SGLang {span_of(FC_FROM_CONFIG, e)})")
    num = drafter_config.get("num_aux_hidden_states")
    if num is not None:
        return int(num), f"{e.label} llama_eagle3.py sizes fc for num_aux_hidden_states = {num}"
    if nested:
        return len(nested), f"{e.label} llama_eagle3.py sizes fc for len(eagle_config ids) = {len(nested)}"
    return 3, f"{e.label} llama_eagle3.py sizes fc for 3 states (no num_aux_hidden_states, no nested ids)"
