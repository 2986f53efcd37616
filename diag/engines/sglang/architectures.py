"""Which of SGLang's code paths a target config selects. Two different questions, two names:

capture_model(config): whose `set_eagle3_layers_to_capture` runs, i.e. which model class's
  layer-id rule the engine applies to the drafter's ids (capture.py says which rule that is
  at each version). "kimi_k25" for the Kimi-K2.5 wrapper (kimi_k25.py, which delegates to
  deepseek_v2.py since 0.5.10), "kimi_vl" for Kimi-VL (kimi_vl.py, no capture method),
  "deepseek" for DeepSeek-V2/V3 and Kimi-K2 text checkpoints (deepseek_v2.py), "llama" for
  every other target (llama.py's `id + 1`, which qwen3.py and the other dense models share).
  Worked example: KimiK25ForConditionalGeneration (text_config.model_type kimi_k2) -> "kimi_k25";
  DeepseekV3ForCausalLM with model_type kimi_k2 -> "deepseek".

auto_defaults_key(config): what SGLang's auto tree defaults are keyed on: architectures[0]
  as written, never the text model inside a wrapper. Kimi-K2.5 -> "KimiK25ForConditionalGeneration".

This module reads config dicts; it knows nothing about files or versions.
"""

from __future__ import annotations

from diag.checkpoint.config import architecture, text_config

DEEPSEEK_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
})
DEEPSEEK_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"})
WRAPPERS = {"KimiK25ForConditionalGeneration": "kimi_k25", "KimiVLForConditionalGeneration": "kimi_vl"}
WRAPPER_MODEL_TYPES = {"kimi_k25": "kimi_k25", "kimi_vl": "kimi_vl"}


def capture_model(target_config: dict) -> str:
    """"kimi_k25", "kimi_vl", "deepseek" or "llama": whose capture method the engine runs."""
    archs = list(target_config.get("architectures") or ())
    for arch in archs:
        if arch in WRAPPERS:
            return WRAPPERS[arch]
    if target_config.get("model_type") in WRAPPER_MODEL_TYPES:
        return WRAPPER_MODEL_TYPES[target_config["model_type"]]
    types = {target_config.get("model_type"), text_config(target_config).get("model_type")}
    if set(archs) & DEEPSEEK_ARCHITECTURES or types & DEEPSEEK_MODEL_TYPES:
        return "deepseek"
    return "llama"


def is_deepseek_family(target_config: dict) -> bool:
    """DeepSeek-V2/V3 and the Kimi targets built on them (the first-id rule's family)."""
    return capture_model(target_config) in ("deepseek", "kimi_k25", "kimi_vl")


def auto_defaults_key(target_config: dict | None) -> str:
    """architectures[0] of the target ("Unknown" when there is no config)."""
    return architecture(target_config or {}) or "Unknown"
